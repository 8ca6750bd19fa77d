"""``ClientStreams``: the output stages' streams on their way to the caller.

A session's output stages (the thinker's text, code2wav's audio) stream their chunks to
the session's actor, which turns them into the caller's events. Each stream is checked
as a stage's input is: its chunks are numbered (a duplicate is dropped, a gap breaks the
stream) and stay within a window of chunks the caller has not read yet.

Flow control (``omni_actors.actors.stage.flow``): the caller's reads of the channel grant the
window back, so the events queued for the caller (held ones included) stay within a
window of chunks per output stage, and a caller that stops reading makes the output
stages wait. A chunk whose events are dropped (a cancelled or failed response), or that
carries nothing for the caller, counts as taken at once.

The transcriber's stream (``outputs.transcript``: a stage beside the entry, or the
entry stage when it transcribes) is about the caller's turns, not a response: each of
its chunks becomes a ``TranscriptDelta``, ``TranscriptDone`` or
``TranscriptFailed`` event at once, never held behind a response.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from omni_actors.actors.engines.transcriber_ports import (
    ITEM_FIELD,
    TRANSCRIPT_DELTA_FIELD,
    TRANSCRIPT_ERROR_FIELD,
    TRANSCRIPT_FIELD,
)
from omni_actors.actors.stage.accumulate import ChunkGapError, ChunkSequence
from omni_actors.actors.stage.flow import Inflow
from omni_actors.errors import OmniError, ProtocolError
from omni_actors.pipeline.pending_response import PendingResponse
from omni_actors.pipeline.session_channel import SessionChannel
from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.control import StreamCredit
from omni_actors.protocols.events import (
    AudioDelta,
    TextDelta,
    TranscriptDelta,
    TranscriptDone,
    TranscriptFailed,
)
from omni_actors.protocols.stage import Chunk, SessionKey

__all__ = ["ClientStreams"]


class ClientStreams:
    """The output stages' streams of one session key, into ``channel``.

    Args:
        session: the session's id (in every event).
        key: the session's key on the stages (a reopened session gets new streams).
        channel: where the caller reads the events.
        senders: the output stages, by name: where their credits go.
        transcriber: the output stage whose chunks are transcripts ("" if none).
        conversation: the session is a conversation (resumable): a reply's deltas wait
            until the caller asks for it (``SessionChannel.put_delta``).
    """

    def __init__(
        self,
        session: str,
        key: SessionKey,
        channel: SessionChannel,
        senders: Mapping[str, ActorAddress[StreamCredit] | None],
        transcriber: str = "",
        *,
        conversation: bool = False,
    ) -> None:
        self.session = session
        self.transcriber = transcriber
        self.conversation = conversation
        self.channel = channel
        # The streams end here: their credits come from the caller's reads.
        self.inflow = Inflow(key, "client", channel.window, senders)
        channel.attach(self.inflow)
        self._sequences: dict[str, ChunkSequence] = {}

    def take(
        self, chunk: Chunk, response_of: Callable[[int], PendingResponse | None], current: int
    ) -> OmniError | int:
        """Emit ``chunk``'s events (``response_of`` its segment; ``current``: the segment
        whose events go to the caller now): the error that broke its stream, or the
        credits now due to its sender (see the module docstring)."""
        source = chunk.source
        sequence = self._sequences.get(source)
        if sequence is None:
            sequence = self._sequences[source] = ChunkSequence(f"{source} -> client")
        try:
            if not sequence.accept(chunk.seq):
                return 0
        except ChunkGapError as exc:
            return exc
        inflow = self.inflow
        try:
            inflow.received(source)
        except ProtocolError as exc:  # past its window: refused, never queued
            return exc
        if source == self.transcriber:
            event = self._transcript(chunk)
            if event is None:
                return inflow.taken(source)
            self.channel.put(event, source)
            return 0
        response = response_of(chunk.segment)
        if response is None or response.status != "completed":
            # Done, or cancelled or failed: what it still says is moot (and taken now).
            return inflow.taken(source)
        text_delta, audio_delta = response.deltas(chunk, self.session, self.channel.sample_rate)
        last = audio_delta if audio_delta is not None else text_delta
        if last is None:  # nothing for the caller to read: taken now
            return inflow.taken(source)
        now = chunk.segment == current
        if text_delta is not None and audio_delta is not None:
            self.emit(now, response, text_delta, segment=chunk.segment)
        # The chunk is taken once the caller reads its last event.
        self.emit(now, response, last, source, segment=chunk.segment)
        return 0

    def _transcript(
        self, chunk: Chunk
    ) -> TranscriptDelta | TranscriptDone | TranscriptFailed | None:
        """The caller's event for a chunk of the transcriber's (None: it says nothing)."""
        texts = chunk.texts
        item = texts.get(ITEM_FIELD, "")
        error = texts.get(TRANSCRIPT_ERROR_FIELD)
        if error is not None:
            return TranscriptFailed(
                session=self.session, item=item, code="engine_error", message=error
            )
        transcript = texts.get(TRANSCRIPT_FIELD)
        if transcript is None:
            delta = texts.get(TRANSCRIPT_DELTA_FIELD)
            return TranscriptDelta(session=self.session, item=item, delta=delta) if delta else None
        return TranscriptDone(session=self.session, item=item, transcript=transcript)

    def emit(
        self,
        now: bool,
        response: PendingResponse,
        event: TextDelta | AudioDelta,
        source: str = "",
        *,
        segment: int,
    ) -> None:
        """A delta of ``segment``'s reply: to the caller ``now`` (its segment is the
        current one), else held for later.

        ``source``: the output stage whose chunk ``event`` ends (see ``SessionChannel``).
        """
        if now:
            self.put(event, source, segment)
        else:
            response.held.append((event, source))

    def put(self, event: TextDelta | AudioDelta, source: str, segment: int) -> None:
        """Queue a delta of the current segment's reply for the caller: in a conversation,
        under its response's id once the caller has asked for it (until then it waits)."""
        if self.conversation:
            self.channel.put_delta(event, source, segment)
        else:
            self.channel.put(event, source)

    async def taken(self, source: str) -> None:
        """A chunk from ``source`` that the caller will not read counts as taken."""
        due = self.inflow.taken(source)
        if due:
            await self.inflow.grant(source, due)

    async def drop_held(self, response: PendingResponse) -> None:
        """Drop the events held for ``response``; their chunks count as taken."""
        held, response.held = response.held, []
        for _, source in held:
            if source:
                await self.taken(source)
