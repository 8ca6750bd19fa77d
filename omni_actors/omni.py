"""``OmniPipeline``: the library entry point.

::

    async with OmniPipeline("scripted-omni") as omni:
        async for event in omni.generate(text="Hello"):
            ...  # TextDelta, AudioDelta, then Done (or SessionError / Aborted)

``generate`` is a one-shot request; ``session()`` opens a resumable session whose input
arrives in segments (streaming audio in, a reply per segment, conversation state kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from omni_actors._actor import Actor
from omni_actors._ref import ActorRef
from omni_actors._system import ActorSystem
from omni_actors.actors.messages import Inspect, StageState
from omni_actors.actors.stage import StageActor
from omni_actors.errors import OmniError
from omni_actors.orchestrator import (
    ListSessions,
    ListStages,
    Orchestrator,
    StartSession,
    pipeline_strategy,
)
from omni_actors.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.events import TERMINAL, Aborted, Event, SegmentDone, SessionError
from omni_actors.protocols.stage import INPUT, Chunk, End, split_fields
from omni_actors.session import AbortSession, OpenSession, SessionChannel

__all__ = ["Modality", "OmniPipeline", "Session", "SessionClosedError"]

Modality = Literal["text", "audio"]

_GRACE_S = 5.0  # beyond total_s: the stages' own deadline fires first
_ABORT_TIMEOUT_S = 10.0
_names = itertools.count(1)


class SessionClosedError(OmniError):
    """Input was sent to a session that has already ended."""


class OmniPipeline:
    """A running pipeline: its stages, orchestrator and admission control.

    Args:
        pipeline: a :class:`PipelineSpec`, a preset name or a YAML path.
        max_sessions: sessions served at once; further requests wait for a slot, up to
            the pipeline's ``deadlines.admission_s``.
        system: run inside this actor system (default: a system of its own).
        stage_classes: harness hook: per stage, an actor class used instead of
            ``StageActor`` (see ``omni_actors.testing.PipelineFaults``).
        interposers: harness hook: per edge ``"from->to"``, an actor class (and extra
            arguments) put between the two stages.
    """

    def __init__(
        self,
        pipeline: PipelineSpec | str | Path = "scripted-omni",
        *,
        max_sessions: int = 256,
        system: ActorSystem | None = None,
        stage_classes: dict[str, type[StageActor]] | None = None,
        interposers: dict[str, tuple[type[Actor[Any]], tuple[Any, ...]]] | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.spec = pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline)
        self.max_sessions = max_sessions
        self._system = system
        self._own_system = system is None
        self._stage_classes = stage_classes
        self._interposers = interposers
        self._orchestrator: ActorRef[Any] | None = None
        self._slots = asyncio.Semaphore(max_sessions)

    async def __aenter__(self) -> OmniPipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the stages (``async with`` does this)."""
        if self._system is None:
            self._system = ActorSystem(f"omni-{self.spec.name}")
        system = self._system
        if self._own_system:
            await system.start()
        try:
            self._orchestrator = await system.spawn(
                Orchestrator,
                self.spec,
                self._stage_classes,
                self._interposers,
                name=f"{self.spec.name}-{next(_names)}",
                strategy=pipeline_strategy(self.spec),
            )
        except BaseException:
            if self._own_system:
                await system.shutdown()
            raise

    async def close(self) -> None:
        """Stop every stage; sessions still open end with a ``SessionError``."""
        system, orchestrator = self._system, self._orchestrator
        self._orchestrator = None
        if system is None:
            return
        if orchestrator is not None:
            await system.stop(orchestrator)
        if self._own_system:
            await system.shutdown()
            self._system = None

    @property
    def orchestrator(self) -> ActorRef[Any]:
        """The orchestrator's ref (raises if the pipeline is not started)."""
        if self._orchestrator is None:
            raise RuntimeError("the pipeline is not started; use 'async with OmniPipeline(...)'")
        return self._orchestrator

    async def live_sessions(self) -> dict[str, list[str]]:
        """Open sessions by stage, as the orchestrator knows them."""
        result: dict[str, list[str]] = await self.orchestrator.ask(ListSessions())
        return result

    async def stages(self) -> dict[str, ActorRef[Any]]:
        """Every stage's ref by name."""
        result: dict[str, ActorRef[Any]] = await self.orchestrator.ask(ListStages())
        return result

    async def inspect(self, timeout: float = 5.0) -> dict[str, StageState]:
        """What every stage holds right now (session ids), by stage name."""
        refs = await self.stages()
        states = await asyncio.gather(*(r.ask(Inspect(), timeout=timeout) for r in refs.values()))
        return dict(zip(refs, states, strict=True))

    def generate(
        self,
        text: str | None = None,
        audio: torch.Tensor | None = None,
        *,
        modalities: tuple[Modality, ...] = ("text", "audio"),
        session_id: str | None = None,
    ) -> AsyncIterator[Event]:
        """One request: its events as they are produced, ending with a terminal event.

        Stopping the iteration early (``break``, ``aclose``, cancelling the task) aborts
        the session on every stage.
        """
        return self._generate(text, audio, modalities, session_id)

    async def _generate(
        self,
        text: str | None,
        audio: torch.Tensor | None,
        modalities: tuple[Modality, ...],
        session_id: str | None,
    ) -> AsyncIterator[Event]:
        session = Session(self, modalities=modalities, session_id=session_id, resumable=False)
        try:
            error = await session.open()
            if error is not None:
                yield error
                return
            await session.send(text=text, audio=audio, end="finished")
            async for event in session:
                yield event
        finally:
            await session.close()

    def session(
        self, *, modalities: tuple[Modality, ...] = ("text", "audio"), session_id: str | None = None
    ) -> Session:
        """A resumable session: ``async with omni.session() as s: ...``."""
        return Session(self, modalities=modalities, session_id=session_id, resumable=True)


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
        self.channel = SessionChannel(sample_rate=pipeline.spec.outputs.sample_rate)
        self._ref: ActorRef[Any] | None = None
        self._key = ""  # the session's key on the stages (the id plus an admission count)
        self._entry: ActorRef[Any] | None = None
        self._seq = 0
        self._segment = 0
        self._slot = False
        self._drained = False  # the terminal event has been handed to the caller
        self._expiry: asyncio.TimerHandle | None = None
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
        loop = asyncio.get_running_loop()
        self.channel.starts[0] = time.monotonic()
        start = loop.time()
        admission_deadline = start + spec.deadlines.admission_s
        # The caller's last line of defence: the stages' own deadlines fire first.
        self._expiry = loop.call_at(start + spec.deadlines.total_s + _GRACE_S, self._expire)
        try:
            async with asyncio.timeout_at(admission_deadline):
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
                timeout=max(0.001, admission_deadline - loop.time()),
            )
            if isinstance(reply, OmniError):
                return self._closed(
                    SessionError(session=self.id, code="admission", message=str(reply))
                )
            self._ref, self._entry, self._key = reply.session, reply.entry, reply.key
            error: SessionError | None = await reply.session.ask(
                OpenSession(), timeout=max(0.001, admission_deadline - loop.time()) + _GRACE_S
            )
        except (OmniError, TimeoutError) as exc:
            if not isinstance(exc, TimeoutError):  # the pipeline itself has stopped
                return self._closed(
                    SessionError(session=self.id, code="internal", message=str(exc))
                )
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

        Raises:
            SessionClosedError: the session has ended (its terminal event says why).
        """
        if self.ended or self._entry is None:
            raise SessionClosedError(f"session {self.id} has ended; open a new one")
        payload: dict[str, torch.Tensor | str] = dict(fields or {})
        if text is not None:
            payload["text"] = text
        if audio is not None:
            payload["audio"] = audio
        tensors, texts = split_fields(payload)
        if end and (self.resumable or self._segment > 0):
            # A segment's latency counts from the end of its input; a one-shot request's
            # from the call (admission and prewarm included).
            self.channel.starts[self._segment] = time.monotonic()
        chunk = Chunk(
            session=self._key,
            source=INPUT,
            seq=self._seq,
            tensors=tensors,
            texts=texts,
            end=end,
            sent_at=time.monotonic(),
        )
        self._seq += 1
        await self._entry.tell(chunk)
        if end:
            self._segment += 1

    async def end_segment(self) -> None:
        """End the current input segment: the pipeline answers it and stays open."""
        await self.send(end="segment")

    async def finish(self) -> None:
        """End the last segment and the session."""
        await self.send(end="finished")

    async def abort(self, reason: str = "aborted by the caller") -> None:
        """End the session now on every stage; the event stream ends with ``Aborted``.

        The caller's stream ends at once; this returns once every stage has freed the
        session (or its session actor is gone).
        """
        if self.channel.end(Aborted(session=self.id, reason=reason)):
            await self._abort_stages(reason)

    async def _abort_stages(self, reason: str) -> None:
        if self._ref is not None:
            # If the session actor is gone, so is the session.
            with contextlib.suppress(OmniError):
                await self._ref.ask(AbortSession(reason), timeout=_ABORT_TIMEOUT_S)

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
        return await self.channel.events.get()

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
