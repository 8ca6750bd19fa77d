"""``SessionInput``: a session's input on its way to the entry stage.

The caller's :class:`~omni_actors.serving.session.Session` decides what to send (text,
audio, turn marks, segment ends, a response's options); this turns it into the chunks
the entry stage takes. Each chunk is numbered (the stage drops a duplicate and fails a
gap) and carries its segment; a segment end moves on to the next segment. Each chunk
spends a credit of the window the entry stage grants (``omni_actors.actors.flow``):
once a window of chunks is in flight, a send waits for the stage to take some,
``deadlines.inter_chunk_s`` at most, and a stage that takes none in that time fails the
session with :class:`~omni_actors.actors.flow.BackpressureError` rather than letting the
caller's input queue up anywhere.

Audio is resampled to the entry stage's rate as one stream (:class:`CallerAudio`): its
tail is sent before a turn boundary, dropped with a ``clear``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

import torch

from omni_actors._ref import ActorRef
from omni_actors.actors.flow import BackpressureError, CreditWindow
from omni_actors.clock import Clock
from omni_actors.errors import OmniError, qualified_name
from omni_actors.protocols.events import SessionError
from omni_actors.protocols.stage import (
    INPUT,
    Chunk,
    End,
    Mark,
    ResponseOptions,
    SessionKey,
    split_fields,
)
from omni_actors.serving.resample import CallerAudio
from omni_actors.serving.session_channel import SessionChannel

__all__ = ["SessionClosedError", "SessionInput"]


class SessionClosedError(OmniError):
    """Input was sent to a session that has already ended."""


class SessionInput:
    """The chunks of one session's input (see the module docstring).

    Args:
        session: the session's id (in the error a stalled entry stage ends it with).
        channel: the session's channel: its ``input`` window, and where that error goes.
        sample_rate: the rate the entry stage takes audio at (``inputs.sample_rate``).
        entry_stage: the entry stage's name, for that error.
        clock: the pipeline's clock, for the wait for a credit.
        credit_wait_s: the longest wait for a credit (``deadlines.inter_chunk_s``).
        abort_stages: frees the session on every stage, given a reason; called when a
            stalled entry stage ended the session.

    Attributes:
        audio: the caller's audio, resampled as one stream.
        segment: the segment the next chunk belongs to (segments ended so far).
    """

    def __init__(
        self,
        session: str,
        channel: SessionChannel,
        *,
        sample_rate: int,
        entry_stage: str,
        clock: Clock,
        credit_wait_s: float,
        abort_stages: Callable[[str], Awaitable[None]],
    ) -> None:
        self.session = session
        self.channel = channel
        self.entry_stage = entry_stage
        self.clock = clock
        self.credit_wait_s = credit_wait_s
        self._abort_stages = abort_stages
        self.audio = CallerAudio(sample_rate)
        self.segment = 0
        self._seq = 0
        self._entry: ActorRef[Chunk] | None = None
        self._key = SessionKey("")

    def connect(self, entry: ActorRef[Chunk], key: SessionKey) -> None:
        """The session was admitted: its input goes to ``entry``, for session ``key``."""
        self._entry, self._key = entry, key

    @property
    def connected(self) -> bool:
        """Whether :meth:`connect` was called (the session was admitted)."""
        return self._entry is not None

    async def send(
        self,
        payload: Mapping[str, torch.Tensor | str],
        *,
        end: End = "",
        mark: Mark = "",
        kept: int = 0,
        options: ResponseOptions | None = None,
    ) -> None:
        """Send one chunk, once the window has room for it.

        Raises:
            SessionClosedError: the session ended while this waited (nothing was sent).
            BackpressureError: the entry stage took none of the chunks in flight within
                ``deadlines.inter_chunk_s``; the session has ended with that error.
        """
        assert self._entry is not None, "send after connect"
        credits = self.channel.input
        if not credits.try_take() and not await self._wait_for_credit(credits):
            raise SessionClosedError(f"session {self.session} has ended; open a new one")
        tensors, texts = split_fields(payload)
        chunk = Chunk(
            key=self._key,
            source=INPUT,
            seq=self._seq,
            tensors=tensors,
            texts=texts,
            end=end,
            segment=self.segment,
            sent_at=time.monotonic(),
            mark=mark,
            kept=kept,
            options=options,
        )
        self._seq += 1
        await self._entry.tell(chunk)
        if end:
            self.segment += 1

    async def _wait_for_credit(self, credits: CreditWindow) -> bool:
        limit = self.credit_wait_s
        try:
            return await credits.take(self.clock, limit)
        except TimeoutError:
            entry = f"stage {self.entry_stage}"
            error = BackpressureError("the caller", entry, self._key, credits.size, limit)
            if self.channel.end(
                SessionError(
                    session=self.session,
                    code=error.code,
                    message=str(error),
                    stage=self.entry_stage,
                    error_type=qualified_name(error),
                )
            ):
                await self._abort_stages("backpressure")
            raise error from None
