"""``Session``: the caller's handle on one session of an :class:`OmniPipeline`.

``OmniPipeline.session()`` returns one for streaming input in segments; ``generate``
drives one for a one-shot request. It sends input straight to the entry stage (within
the credit window the entry stage grants: see ``flow`` in the pipeline), reads the
events its session actor queues, and owns the session's admission slot and last-resort
deadline. Both deadlines read the pipeline's system clock (``ActorSystem.clock``), so a
pipeline in a system with a virtual clock runs them on virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Literal

import torch

from omni_actors._ref import ActorRef
from omni_actors.actors.flow import BackpressureError, CreditWindow
from omni_actors.clock import TimerHandle, timeout_at
from omni_actors.errors import OmniError, qualified_name
from omni_actors.protocols.control import AbortSession, OpenSession, SessionMessage
from omni_actors.protocols.events import TERMINAL, Aborted, Event, SegmentDone, SessionError
from omni_actors.protocols.stage import INPUT, Chunk, End, SessionKey, split_fields
from omni_actors.serving.orchestrator import StartSession
from omni_actors.serving.session_actor import SessionChannel

if TYPE_CHECKING:
    from omni_actors.serving.omni_pipeline import OmniPipeline

__all__ = ["Modality", "Session", "SessionClosedError"]

Modality = Literal["text", "audio"]

_GRACE_S = 5.0  # beyond total_s: the stages' own deadline fires first
_ABORT_TIMEOUT_S = 10.0


class SessionClosedError(OmniError):
    """Input was sent to a session that has already ended."""


class Session:
    """The caller's handle on one session (``OmniPipeline.session()`` or ``generate``).

    Send input with :meth:`send`; end a segment with :meth:`end_segment` (the pipeline
    replies, then waits for the next segment with the session's state kept) or the
    session with :meth:`finish`. Iterate :meth:`events` for one segment's events, or
    the session itself for all of them up to the terminal event.
    """

    def __init__(
        self,
        pipeline: OmniPipeline,
        *,
        modalities: tuple[Modality, ...],
        session_id: str | None,
        resumable: bool,
    ) -> None:
        unknown = set(modalities) - {"text", "audio"}
        if unknown or not modalities:
            raise ValueError(f"modalities must be 'text' and/or 'audio', got {modalities!r}")
        self.pipeline = pipeline
        self.id = session_id or uuid.uuid4().hex
        self.modalities = modalities
        self.resumable = resumable
        self.channel = SessionChannel(
            sample_rate=pipeline.spec.outputs.sample_rate, window=pipeline.spec.flow.window
        )
        self._ref: ActorRef[SessionMessage] | None = None
        self._key = SessionKey("")  # the session's key on the stages, once admitted
        self._entry: ActorRef[Chunk] | None = None
        self._seq = 0
        self._segment = 0
        self._slot = False
        self._drained = False  # the terminal event has been handed to the caller
        self._expiry: TimerHandle | None = None
        self._expiring: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Session:
        error = await self.open()
        if error is not None:
            await self.close()
            raise SessionClosedError(f"session {self.id} could not open: {error.message}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def ended(self) -> bool:
        """True once the terminal event has been emitted."""
        return self.channel.terminal is not None

    async def open(self) -> SessionError | None:
        """Admission and prewarm, within ``deadlines.admission_s``; an error is returned."""
        spec = self.pipeline.spec
        clock = self.pipeline.clock
        self.channel.starts[0] = time.monotonic()
        start = clock.now()
        admission_deadline = start + spec.deadlines.admission_s
        # The caller's last line of defence: the stages' own deadlines fire first.
        self._expiry = clock.call_at(start + spec.deadlines.total_s + _GRACE_S, self._expire)
        try:
            async with timeout_at(clock, admission_deadline):
                await self.pipeline._slots.acquire()
            self._slot = True
            reply = await self.pipeline.orchestrator.ask(
                StartSession(
                    self.id,
                    "text" in self.modalities,
                    "audio" in self.modalities,
                    self.resumable,
                    admission_deadline,
                    self.channel,
                ),
                timeout=max(0.001, admission_deadline - clock.now()),
            )
            if isinstance(reply, OmniError):
                return self._closed(
                    SessionError(session=self.id, code=reply.code, message=str(reply))
                )
            self._ref, self._entry, self._key = reply.session, reply.entry, reply.key
            error = await reply.session.ask(
                OpenSession(), timeout=max(0.001, admission_deadline - clock.now()) + _GRACE_S
            )
        except (OmniError, TimeoutError) as exc:
            if not isinstance(exc, TimeoutError):  # the pipeline itself has stopped
                return self._closed(SessionError(session=self.id, code=exc.code, message=str(exc)))
            return self._closed(
                SessionError(
                    session=self.id,
                    code="admission",
                    message=(
                        f"not admitted within {spec.deadlines.admission_s:g}s "
                        f"({self.pipeline.max_sessions} sessions at most); retry later or "
                        "raise deadlines.admission_s / max_sessions"
                    ),
                )
            )
        return error

    def _closed(self, error: SessionError) -> SessionError:
        self.channel.end(error)
        return error

    async def send(
        self,
        *,
        text: str | None = None,
        audio: torch.Tensor | None = None,
        fields: Mapping[str, torch.Tensor | str] | None = None,
        end: End = "",
    ) -> None:
        """Send input (``text``, ``audio`` samples, or named ``fields``) to the entry stage.

        ``end`` ends the current segment (``segment``) or the session (``finished``).
        Once a window of input chunks (``flow.window``) is in flight, this waits until the
        entry stage takes some, ``deadlines.inter_chunk_s`` at most.

        Raises:
            SessionClosedError: the session has ended (its terminal event says why).
            BackpressureError: the entry stage took none of the input in flight within
                ``deadlines.inter_chunk_s``; the session has ended with that error.
        """
        if self.ended or self._entry is None:
            raise SessionClosedError(f"session {self.id} has ended; open a new one")
        payload: dict[str, torch.Tensor | str] = dict(fields or {})
        if text is not None:
            payload["text"] = text
        if audio is not None:
            payload["audio"] = audio
        credits = self.channel.input
        if not credits.try_take():
            await self._wait_for_credit(credits)
        tensors, texts = split_fields(payload)
        if end and (self.resumable or self._segment > 0):
            # A segment's latency counts from the end of its input; a one-shot request's
            # from the call (admission and prewarm included).
            self.channel.starts[self._segment] = time.monotonic()
        chunk = Chunk(
            key=self._key,
            source=INPUT,
            seq=self._seq,
            tensors=tensors,
            texts=texts,
            end=end,
            segment=self._segment,
            sent_at=time.monotonic(),
        )
        self._seq += 1
        await self._entry.tell(chunk)
        if end:
            self._segment += 1

    async def _wait_for_credit(self, credits: CreditWindow) -> None:
        limit = self.pipeline.spec.deadlines.inter_chunk_s
        try:
            taken = await credits.take(self.pipeline.clock, limit)
        except TimeoutError:
            entry = f"stage {self.pipeline.spec.entry_stage}"
            error = BackpressureError("the caller", entry, self._key, credits.size, limit)
            if self.channel.end(
                SessionError(
                    session=self.id,
                    code=error.code,
                    message=str(error),
                    stage=self.pipeline.spec.entry_stage,
                    error_type=qualified_name(error),
                )
            ):
                await self._abort_stages("backpressure")
            raise error from None
        if not taken:
            raise SessionClosedError(f"session {self.id} has ended; open a new one")

    async def end_segment(self) -> None:
        """End the current input segment: the pipeline answers it and stays open."""
        await self.send(end="segment")

    async def finish(self) -> None:
        """End the last segment and the session."""
        await self.send(end="finished")

    async def abort(self, reason: str = "aborted by the caller") -> None:
        """End the session now on every stage; the event stream ends with ``Aborted``.

        The caller's stream ends at once; this returns once every stage has dropped the
        session (or its session actor is gone). Each stage's engine frees its state in
        the background, in the session's own task: a slow engine abort holds up nobody.
        """
        if self.channel.end(Aborted(session=self.id, reason=reason)):
            await self._abort_stages(reason)

    async def _abort_stages(self, reason: str) -> None:
        if self._ref is not None:
            # If the session actor is gone, so is the session.
            with contextlib.suppress(OmniError):
                await self._ref.ask(AbortSession(reason=reason), timeout=_ABORT_TIMEOUT_S)

    async def close(self) -> None:
        """Abort if not ended; give the admission slot back."""
        try:
            if not self.ended:
                await self.abort("closed before it ended")
            if self._expiring is not None:
                await self._expiring
        finally:
            if self._expiry is not None:
                self._expiry.cancel()
            if self._slot:
                self._slot = False
                self.pipeline._slots.release()

    def _expire(self) -> None:
        error = SessionError(
            session=self.id,
            code="timeout",
            message=(
                "the session outlived deadlines.total_s "
                f"({self.pipeline.spec.deadlines.total_s:g}s) and its stages did not end it"
            ),
        )
        if self.channel.end(error):
            # Owned by this session: ``close`` waits for it.
            self._expiring = asyncio.get_running_loop().create_task(
                self._abort_stages("deadline"), name=f"expire session {self.id}"
            )

    async def next_event(self) -> Event:
        """The next event (a ``SessionError`` once the session outlives its deadline)."""
        return await self.channel.get()

    async def events(self) -> AsyncIterator[Event]:
        """This segment's events, through ``SegmentDone`` or the terminal event."""
        while not self._drained:
            event = await self.next_event()
            self._drained = isinstance(event, TERMINAL)
            yield event
            if isinstance(event, SegmentDone):
                return

    async def __aiter__(self) -> AsyncIterator[Event]:
        while not self._drained:
            event = await self.next_event()
            self._drained = isinstance(event, TERMINAL)
            yield event
