"""``SessionInput``: a session's input on its way to the entry stage.

The caller's :class:`~omni_actors.pipeline.session.Session` decides what to send (text,
audio, turn marks, segment ends, a response's options); this turns it into the chunks
the entry stage takes. Each chunk is numbered (the stage drops a duplicate and fails a
gap) and carries its segment; a segment end moves on to the next segment. Each chunk
spends a credit of the window the entry stage grants (``omni_actors.actors.stage.flow``):
once a window of chunks is in flight, a send waits for the stage to take some,
``deadlines.inter_chunk_s`` at most, and a stage that takes none in that time fails the
session with :class:`~omni_actors.actors.stage.flow.BackpressureError` rather than letting the
caller's input queue up anywhere.

Audio is resampled to the entry stage's rate as one stream (:class:`CallerAudio`): its
tail is sent before a turn boundary, dropped with a ``clear``.

A session with a transcriber (``outputs.transcript``) fans its input out: while
``transcribing``, each chunk's audio goes to the transcriber too, as its own stream
(numbered and credited apart from the entry stage's), with each turn's ``commit`` or
``clear`` and the item the caller named it by; every segment's end goes there always,
so both stages serve the same segments. The transcriber is sent to after the entry
stage, and a transcriber that stops taking input loses its stream
(``TranscriptFailed``), never the reply's input. A replayed conversation is not sent
there again: its turns were transcribed once.

An entry stage that transcribes (``outputs.transcript`` naming it: a cascade's
recognizer) hears every turn already, for the stages after it: while ``transcribing``,
each turn's item goes to it before the turn's ``commit`` (it tells the caller the
transcripts of the turns it was told the item of), outside the conversation's log, so
a replayed turn is not told again; the settings go to it with the rest of the input.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

import torch

from omni_actors._ref import ActorRef
from omni_actors.actors.engines.transcriber_ports import ITEM_FIELD
from omni_actors.actors.stage.flow import BackpressureError, CreditWindow
from omni_actors.audio.resample import CallerAudio
from omni_actors.clock import Clock
from omni_actors.errors import OmniError, qualified_name
from omni_actors.pipeline.session_channel import SessionChannel
from omni_actors.protocols.error_code import ErrorCode
from omni_actors.protocols.events import SessionError, TranscriptFailed
from omni_actors.protocols.stage import (
    INPUT,
    Chunk,
    End,
    Mark,
    ResponseOptions,
    SessionKey,
    split_fields,
)

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
        reopen: opens the session again on every stage after one restarted and returns
            its new key (raising ``SessionClosedError`` if it could not); a
            conversation with a ``channel.history`` needs it.
        replay_s: how long stages dying one after another under a replay may keep it
            from going through, from its first try (one restart and a prewarm:
            ``deadlines.start_s + admission_s``).
        entry_transcribes: the entry stage is the pipeline's transcriber (see the module
            docstring).

    Attributes:
        audio: the caller's audio, resampled as one stream.
        segment: the segment the next chunk belongs to (segments ended so far).
        transcribing: the caller's audio goes to the transcriber too.
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
        reopen: Callable[[], Awaitable[SessionKey]] | None = None,
        replay_s: float = 0.0,
        entry_transcribes: bool = False,
    ) -> None:
        self.session = session
        self.channel = channel
        self.entry_stage = entry_stage
        self.clock = clock
        self.credit_wait_s = credit_wait_s
        self._abort_stages = abort_stages
        self._reopen = reopen
        self.replay_s = replay_s
        self.entry_transcribes = entry_transcribes
        self._reopening = asyncio.Lock()
        self.audio = CallerAudio(sample_rate)
        self.segment = 0
        self._seq = 0
        self._entry: ActorRef[Chunk] | None = None
        self._key = SessionKey("")
        self._transcriber: ActorRef[Chunk] | None = None
        self._transcriber_seq = 0
        self.transcribing = False
        # What the transcriber was told of the session (language, prompt): told again
        # when the session reopens, since a reopened stage starts from nothing.
        self.transcriber_settings: dict[str, torch.Tensor | str] = {}

    def connect(
        self, entry: ActorRef[Chunk], key: SessionKey, transcriber: ActorRef[Chunk] | None = None
    ) -> None:
        """The session was admitted: its input goes to ``entry`` (and fans out to
        ``transcriber``, if it has one), for session ``key``."""
        self._entry, self._key, self._transcriber = entry, key, transcriber

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
        turn: str = "",
    ) -> None:
        """Send one chunk, once the window has room for it (``turn``: the caller's id for
        the user turn a ``commit`` closes, kept with it in the conversation's log and, to
        the transcriber, the item its transcript names).

        If a stage on the session's path restarted, the session is first opened again
        on every stage and its conversation replayed (``channel.stale``; see
        :mod:`~omni_actors.pipeline.conversation_log`); so is it if one died while the
        chunk waited for a credit or to be sent, and the chunk goes again after that.

        Raises:
            SessionClosedError: the session ended while this waited (nothing was sent),
                or could not be opened again after a stage restarted.
            BackpressureError: the entry stage took none of the chunks in flight within
                ``deadlines.inter_chunk_s``; the session has ended with that error.
        """
        assert self._entry is not None, "send after connect"
        named = self.entry_transcribes and self.transcribing and mark == "commit"
        while True:
            if self.channel.stale or self._reopening.locked():
                async with self._reopening:  # one replay; other senders wait for it
                    if self.channel.stale:
                        await self._replay()
            try:
                if named:  # outside the log (see the module docstring)
                    await self._send({ITEM_FIELD: turn}, "", "", 0, None)
                await self._send(payload, end, mark, kept, options)
            except _Reopen:
                continue  # a stage died while this waited: reopen, then send it
            break
        await self._fan_out(payload, end, mark, turn)
        history = self.channel.history
        if history is not None:
            history.sent(self.segment, payload, mark=mark, kept=kept, end=end, turn=turn)
        if end:
            self.segment += 1
            self.channel.segment_sent(self.segment)

    async def rebuild(self) -> None:
        """Open the session again on every stage and replay its conversation now, if
        the stages were freed (``channel.stale``): after the caller took a turn out of
        it, the next input need not wait for the replay.

        Raises:
            SessionClosedError: as :meth:`send`.
        """
        async with self._reopening:
            if self.channel.stale:
                await self._replay()

    async def _replay(self) -> None:
        """Open the session again on every stage and send its conversation so far.

        A stage that died while the session reopened, or while the conversation went
        out, cuts it again: it starts over, as long as ``replay_s`` allows. Stages that
        keep dying are their supervisor's to give up on (its restart intensity), not a
        count of the session's tries: under faults that come faster than restarts,
        every try may be cut by another stage's death though each one comes back.
        """
        history = self.channel.history
        assert history is not None, "stale only when it can be replayed"
        assert self._reopen is not None, "a replayed session reopens"
        deadline = self.clock.now() + self.replay_s
        while True:
            self._key, self._seq = await self._reopen(), 0
            self._transcriber_seq = 0
            try:
                for chunk in history.replay():
                    await self._send(chunk.payload, "", chunk.mark, chunk.kept, None)
                if self.transcriber_settings:
                    await self.to_transcriber(self.transcriber_settings)
                return
            except _Reopen:
                if self.clock.now() >= deadline:
                    break  # else another stage died meanwhile: from the start again
        error = SessionError(
            session=self.session,
            code="stage_failed",
            message=(
                f"stages kept failing while the conversation was replayed (for {self.replay_s:g} s)"
            ),
        )
        if self.channel.end(error):
            await self._abort_stages("stage_failed")
        raise SessionClosedError(f"session {self.session} has ended: {error.message}")

    async def _send(
        self,
        payload: Mapping[str, torch.Tensor | str],
        end: End,
        mark: Mark,
        kept: int,
        options: ResponseOptions | None,
    ) -> None:
        credits = self.channel.input
        if not credits.try_take() and not await self._wait_for_credit(credits):
            if self.channel.stale and self.channel.terminal is None:
                raise _Reopen
            raise SessionClosedError(f"session {self.session} has ended; open a new one")
        tensors, texts, _ = split_fields(payload)
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
        assert self._entry is not None
        await self._entry.tell(chunk)
        if credits.closed and self.channel.terminal is None:
            # A stage died while the tell waited (for the entry stage's restart, or room
            # in its mailbox): the chunk went out under the key every stage dropped
            # (``SessionChannel.cut``). It goes again once the session is reopened.
            raise _Reopen

    async def transcribe(self, enabled: bool, settings: Mapping[str, torch.Tensor | str]) -> None:
        """Transcribe the caller's turns from now on with ``settings`` (language,
        prompt: "" for none), or (``enabled=False``) no more."""
        was, self.transcribing = self.transcribing, enabled
        if self.entry_transcribes:
            # It hears the turns for the stages after it whatever the caller asked: a
            # turn under way stays, and the settings go with the input (and its replay).
            await self.send(settings)
        elif enabled:
            self.transcriber_settings = dict(settings)
            await self.to_transcriber(settings)
        elif was:
            await self.to_transcriber({}, mark="clear")  # the turn under way is not

    async def _fan_out(
        self, payload: Mapping[str, torch.Tensor | str], end: End, mark: Mark, item: str
    ) -> None:
        """What the transcriber takes of one chunk sent to the entry stage."""
        if self._transcriber is None:
            return
        fields: dict[str, torch.Tensor | str] = {}
        turn: Mark = ""
        if self.transcribing:
            audio = payload.get("audio")
            if isinstance(audio, torch.Tensor) and audio.numel():
                fields["audio"] = audio
            if mark in ("commit", "clear"):
                turn = mark
            if mark == "commit" and item:
                await self.to_transcriber({ITEM_FIELD: item})
        if fields or turn or end:
            await self.to_transcriber(fields, end=end, mark=turn)

    async def to_transcriber(
        self, fields: Mapping[str, torch.Tensor | str], *, end: End = "", mark: Mark = ""
    ) -> None:
        """Send one chunk to the transcriber alone (its settings, a turn mark), once its
        window has room; dropped if it no longer has the session (see the module
        docstring)."""
        transcriber = self._transcriber
        channel = self.channel
        if transcriber is None or channel.transcriber_lost or channel.stale:
            return
        credits = channel.transcriber_input
        if not credits.try_take():
            try:
                if not await credits.take(self.clock, self.credit_wait_s):
                    return  # lost, or the session ended or must reopen: nothing to send
            except TimeoutError:
                self._lose_transcriber(
                    "backpressure",
                    f"the transcriber took none of the input in flight within "
                    f"{self.credit_wait_s:g}s (deadlines.inter_chunk_s); transcription "
                    "stopped for this session",
                )
                return
        tensors, texts, _ = split_fields(fields)
        chunk = Chunk(
            key=self._key,
            source=INPUT,
            seq=self._transcriber_seq,
            tensors=tensors,
            texts=texts,
            end=end,
            segment=self.segment,
            sent_at=time.monotonic(),
            mark=mark,
        )
        self._transcriber_seq += 1
        try:
            await transcriber.tell(chunk)
        except OmniError as exc:  # its actor is gone: the reply's input goes on
            self._lose_transcriber("stage_failed", f"the transcriber is gone: {exc}")

    def _lose_transcriber(self, code: ErrorCode, why: str) -> None:
        if self.channel.transcriber_lost:
            return
        self.channel.lose_transcriber(why)
        self.channel.put(TranscriptFailed(session=self.session, item="", code=code, message=why))

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


class _Reopen(Exception):
    """A stage on the session's path died while a chunk waited for a credit or to be
    sent: the chunk must go again, under the key the session is reopened with."""
