"""``RealtimeConnection``: one realtime client, one conversation session.

The client is on a websocket (``/v1/realtime``) or in a WebRTC call (``/v1/realtime/calls``):
the session is the same, its transport (``realtime_transport.py``) moves the events. In a
call the audio travels on the call's media tracks (:class:`CallAudio`), not in events:
the caller's microphone feeds the input audio buffer as ``input_audio_buffer.append``
would, the reply is played out in real time, and a barge-in or ``response.cancel`` cuts
the reply where the caller stopped hearing it, as a ``conversation.item.truncate`` would.

The connection owns three tasks and waits for the first to end: the reader (client
events, acted on at once and never blocked by the pipeline), the input stream (queued
input handed to the session in order: :class:`~omni_actors.server.input_stream.InputStream`)
and the event pump (the session's events turned into Realtime events); in a call, two
more: the caller's audio and the playout's news (``output_audio_buffer.*``). When one ends —
the client went away, the session ended, the server is shutting down — the others are
cancelled and the session is aborted on every stage: a connection leaves nothing
behind.

What the reader acts on is the connection's own state, kept in one object:

- the input audio buffer (what the Realtime API calls it: audio appended since the last
  commit or clear), run through server VAD (:class:`~omni_actors.server.turns.TurnDetector`),
  and the items a client adds; what the pipeline must hear is queued on the input
  stream, in order, answered with ``speech_started``/``speech_stopped``, ``committed``,
  ``cleared``, ``conversation.item.added``/``done`` and ``conversation.item.truncated``;
- the conversation's items as the server holds them
  (:class:`~omni_actors.server.conversation_items.ConversationItems`:
  ``conversation.item.retrieve`` answers from them; ``conversation.item.delete`` takes
  one out there and, through the session, on every stage);
- input transcription (``session.audio.input.transcription``): while it is on, each
  user item made of audio gets ``conversation.item.input_audio_transcription.delta``
  events as the pipeline's transcriber (a stage beside the entry stage) writes its
  text, one per piece (the whole text in one, from a transcriber that does not
  stream), then ``.completed`` (or ``.failed``), whenever it is done: before, among or
  after the reply's events;
- the responses: one in flight at a time (``active``), each a
  :class:`~omni_actors.server.response_stream.ResponseStream` that turns the pipeline's
  events for it into the Realtime API's. A cancel (``response.cancel``, barge-in, a
  truncate of the reply in flight) cancels it on every stage; from that call on the
  session hands out none of its deltas. An out-of-band response (``conversation:
  "none"``) joins no conversation: once done, its reply is deleted as an item would be.
  Each ``response.done`` is followed by ``rate_limits.updated``.

The collaborators it hands work to are small and tested alone: the input stream, the
turn detector, the response stream, the conversation's items, the session settings and
the audio formats.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

import msgspec
import torch

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD, REPLY_FIELD, TOOLS_FIELD
from omni_actors.actors.engines.tool_calls import MalformedToolCallError
from omni_actors.audio.resample import StreamResampler
from omni_actors.errors import InvalidRequestError, OmniError
from omni_actors.models.family import family_of_kind
from omni_actors.pipeline.session import CancelTimeoutError, Session
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.events import (
    TERMINAL,
    Aborted,
    AudioDelta,
    Done,
    Event,
    SessionError,
    TextDelta,
    TranscriptDelta,
    TranscriptDone,
    TranscriptFailed,
)
from omni_actors.protocols.events import ResponseDone as PipelineResponseDone
from omni_actors.protocols.realtime_client import (
    ClientEvent,
    ClientEventError,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    ItemParam,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
    ResponseParams,
    SessionConfig,
    SessionUpdate,
    decode_client_event,
)
from omni_actors.protocols.realtime_server import (
    BETA_NAMES,
    ConversationItem,
    ConversationItemDeleted,
    ConversationItemRetrieved,
    ConversationItemTranscriptionCompleted,
    ConversationItemTranscriptionDelta,
    ConversationItemTranscriptionFailed,
    ConversationItemTruncated,
    ErrorDetail,
    ErrorEvent,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudioBufferCleared,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    InputAudioBufferTimeoutTriggered,
    ItemContent,
    OutputAudioBufferCleared,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    RateLimit,
    RateLimitsUpdated,
    ResponseOutputAudioDelta,
    ServerEvent,
    SessionCreated,
    SessionUpdated,
    TranscriptionUsage,
)
from omni_actors.server.audio_format import decode_audio, format_rate
from omni_actors.server.conversation_items import ConversationItems
from omni_actors.server.ids import new_id
from omni_actors.server.input_stream import InputStream, Op
from omni_actors.server.model_list import served_name
from omni_actors.server.realtime_transport import CallAudio, ClientGone, EventTransport
from omni_actors.server.request_error import RequestError, described
from omni_actors.server.response_stream import CancelReason, ResponseStream, tool_call_error
from omni_actors.server.session_config import SessionSettings, SettingError
from omni_actors.server.state import ServerState
from omni_actors.server.tools import OfferedTool, new_call_id, template_tools
from omni_actors.server.truncation import ConversationTokens
from omni_actors.server.turns import Forward, Started, Stopped, TimedOut, TurnDetector
from omni_actors.server.voices import VoiceMap

__all__ = ["RealtimeConnection", "checked_update", "new_session_settings"]

log = logging.getLogger(__name__)

_SEND_TIMEOUT_S = 30.0  # a client that reads nothing for this long is dropped
_CLOSE_GOING_AWAY = 1001
_CLOSE_INTERNAL = 1011
_CLOSE_TRY_LATER = 1013
_CLOSE_POLICY = 1008

_encoder = msgspec.json.Encoder()


class RealtimeConnection:
    """One realtime session over a client's transport (see the module docstring).

    Args:
        transport: the client's events, both ways (an accepted websocket, a call's
            data channel).
        state: the server's shared state.
        beta: the client asked for the beta protocol (``OpenAI-Beta: realtime=v1``):
            events go out under their beta names.
        configs: the session configs the session starts from, in order: the one the
            client's ephemeral key is bound to (``client_secrets.py``), a call's own.
        audio: a call's media tracks: the audio goes there, not in events.
    """

    def __init__(
        self,
        transport: EventTransport,
        state: ServerState,
        *,
        beta: bool = False,
        configs: Sequence[SessionConfig] = (),
        audio: CallAudio | None = None,
    ) -> None:
        self.transport = transport
        self.audio = audio
        self.state = state
        self.beta = beta
        self.bound = tuple(configs)
        spec = state.pipeline.spec
        self.settings = SessionSettings(
            id=new_id("sess"), model=served_name(state), created_at=time.time()
        )
        self.log = logging.LoggerAdapter(log, {"session": self.settings.id})
        self.voices = VoiceMap()  # the voice names it takes: the server's, once served
        self.session: Session | None = None
        self.input: InputStream | None = None
        self.source_rate = spec.outputs.sample_rate
        self._takes_instructions = INSTRUCTIONS_FIELD in spec.entry_inputs()
        self.sent_instructions = ""
        self._takes_tools = TOOLS_FIELD in spec.entry_inputs()
        self.sent_tools = template_tools(())
        self.items = ConversationItems()  # the conversation's items, as the server holds them
        self.tokens = ConversationTokens()  # its size through each reply (truncation)
        # The transcription models served (the pipeline's transcriber's names), and the
        # user items sent for transcription, not transcribed yet: their audio's seconds.
        self.transcribers = _transcribers(spec)
        self.transcribing: dict[str, float] = {}
        self.transcribed: dict[str, str] = {}  # their text told so far (deltas sent)
        self.conversation_id = new_id("conv")
        self.closing = False
        # The input audio buffer: samples appended since the last commit or clear, the
        # user item being spoken, and server VAD (None with ``turn_detection: null``).
        self.buffered = 0
        self.held: list[torch.Tensor] = []  # the buffer's samples, as sent on
        self.pending_item: str | None = None
        self.turns: TurnDetector | None = None
        # Responses: the one in flight, the last one started (its item is the one a
        # truncate may cut), those not done yet, by id, and the out-of-band ones among
        # them (``conversation: "none"``).
        self.active: ResponseStream | None = None
        self.last_response: ResponseStream | None = None
        self.streams: dict[str, ResponseStream] = {}
        self.out_of_band: set[str] = set()
        # What the client did last (an event, or a call's audio), for the idle timeout;
        # the lock keeps a call's audio and its events from interleaving their work.
        self.heard_at = time.monotonic()
        self._acting = asyncio.Lock()
        self._caller: StreamResampler | None = None  # a call's audio -> the input rate
        self._overflowing = False  # a call's audio overflowed the buffer: told once

    # -- lifecycle ---------------------------------------------------------------------

    async def serve(self) -> None:
        """Run the session until the client leaves, the session ends or the server stops."""
        state = self.state
        session = state.pipeline.session(
            modalities=("text", "audio"),
            session_id=self.settings.id,
            transcription=bool(self.transcribers),
        )
        self.session = session
        state.connections.add(self)
        state.metrics.session_opened()
        try:
            error = await session.open()
            if error is not None:
                await self.fail(error.code, error.message, close_code=_CLOSE_TRY_LATER)
                return
            self.voices = await state.voices()
            # session.created names the voice a reply speaks with, not null.
            self.settings = replace(self.settings, voice=self.voices.default)
            for config in self.bound:
                try:
                    self.settings = checked_update(
                        self.settings, config, state.pipeline.spec, self.voices
                    )
                except RequestError as exc:  # checked when the key was made: rare
                    await self.fail(exc.realtime_code, str(exc), close_code=_CLOSE_POLICY)
                    return
            self.input = InputStream(session, self.input_rate, self._refused, self._truncated)
            self._apply_vad()
            await self.send(
                SessionCreated(event_id=new_id("event"), session=self.settings.describe())
            )
            if self.settings.instructions:
                self.queue_instructions(self.settings.instructions)
            self.queue_tools()
            if self.settings.transcription is not None:
                self.input.put(Op("transcribe", transcription=self.settings.transcription))
            tasks = [
                asyncio.create_task(self._read(), name=f"realtime {self.settings.id} reader"),
                asyncio.create_task(self.input.run(), name=f"realtime {self.settings.id} input"),
                asyncio.create_task(self._pump(), name=f"realtime {self.settings.id} events"),
            ]
            if self.audio is not None:
                tasks.append(
                    asyncio.create_task(
                        self.audio.listen(self._caller_audio),
                        name=f"realtime {self.settings.id} caller audio",
                    )
                )
                tasks.append(
                    asyncio.create_task(
                        self._playout(self.audio), name=f"realtime {self.settings.id} playout"
                    )
                )
            try:
                _done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, ClientGone):
                    self.log.error(
                        "session %s failed: %r", self.settings.id, result, exc_info=result
                    )
        finally:
            await session.close()
            state.connections.discard(self)
            state.metrics.session_closed()
            with contextlib.suppress(Exception):
                code = _CLOSE_INTERNAL if not self.closing else _CLOSE_GOING_AWAY
                await self.transport.close(code, "")
            self.log.info("session %s closed", self.settings.id)

    @property
    def input_rate(self) -> int:
        """The sample rate of the session's input audio format."""
        return format_rate(self.settings.input_format)

    async def shut_down(self, message: str) -> None:
        """The server is stopping: a final ``error`` event, then a close frame (1001)."""
        self.closing = True
        await self.fail("server_shutting_down", message, close_code=_CLOSE_GOING_AWAY)

    async def fail(self, code: str, message: str, *, close_code: int) -> None:
        """Tell the client why the session ends (an ``error`` event) and close."""
        self.state.metrics.error(code)
        with contextlib.suppress(Exception):
            await self.send(
                ErrorEvent(
                    event_id=new_id("event"),
                    error=ErrorDetail(type="server_error", code=code, message=message),
                )
            )
            await self.transport.close(close_code, message[:120])

    # -- sending -----------------------------------------------------------------------

    async def send(self, event: ServerEvent) -> None:
        """Send one event (under its beta name for a beta client), within a deadline.

        In a call, the reply's audio is played on the call's track, not sent as deltas.
        """
        if self.audio is not None and isinstance(event, ResponseOutputAudioDelta):
            return
        data = _encoder.encode(event)
        name = event.__struct_config__.tag
        assert isinstance(name, str)
        if self.beta and name in BETA_NAMES:
            # msgspec writes the tag first: swap the name without decoding the event.
            data = b'{"type":"%s"' % BETA_NAMES[name].encode() + data[len(name) + 10 :]
        async with asyncio.timeout(_SEND_TIMEOUT_S):
            await self.transport.send(data.decode())
        self.state.metrics.sent(name)

    async def send_all(self, events: list[ServerEvent]) -> None:
        """Send ``events`` in order."""
        for event in events:
            await self.send(event)

    async def client_error(
        self, code: str, message: str, event_id: str | None, param: str | None = None
    ) -> None:
        """An ``error`` event for a client event that could not be acted on."""
        self.state.metrics.error(code)
        self.log.info("session %s: %s (%s)", self.settings.id, message, code)
        await self.send(
            ErrorEvent(
                event_id=new_id("event"),
                error=ErrorDetail(
                    type="invalid_request_error",
                    code=code,
                    message=message,
                    param=param,
                    event_id=event_id,
                ),
            )
        )

    # -- the reader --------------------------------------------------------------------

    async def _read(self) -> None:
        limits = self.state.settings
        while True:
            try:
                async with asyncio.timeout(self._idle_left()):
                    data = await self.transport.receive()
            except TimeoutError:
                if self._idle_left() > 0:
                    continue  # a call's audio came meanwhile: the client is there
                await self.fail(
                    "idle_timeout",
                    f"no client event for {limits.idle_timeout_s:g}s (idle_timeout_s)",
                    close_code=1000,
                )
                return
            if data is None:
                return
            self.heard_at = time.monotonic()
            if isinstance(data, bytes):
                await self.client_error(
                    "invalid_event", "events are JSON text frames, not binary ones", None
                )
                continue
            if len(data) > limits.max_message_bytes:
                await self.client_error(
                    "message_too_large",
                    f"an event is at most {limits.max_message_bytes} bytes (max_message_bytes)",
                    None,
                )
                continue
            try:
                event = decode_client_event(data)
            except ClientEventError as exc:
                self.state.metrics.received("invalid")
                await self.client_error(exc.code, str(exc), exc.event_id, exc.param)
                continue
            self.state.metrics.received(event.__struct_config__.tag)  # type: ignore[arg-type]
            try:
                async with self._acting:
                    await self._handle(event)
            except InvalidRequestError as exc:
                await self.client_error(
                    *described(exc), event.event_id, getattr(exc, "param", None)
                )

    async def _playout(self, audio: CallAudio) -> None:
        """Tell a call's client when a reply starts playing, ends, or is cut."""
        while True:
            kind, response_id = await audio.playout()
            event_id = new_id("event")
            await self.send(
                OutputAudioBufferStarted(event_id=event_id, response_id=response_id)
                if kind == "started"
                else OutputAudioBufferStopped(event_id=event_id, response_id=response_id)
                if kind == "stopped"
                else OutputAudioBufferCleared(event_id=event_id, response_id=response_id)
            )

    def _idle_left(self) -> float:
        """Seconds until the session is idle for ``idle_timeout_s``."""
        return self.heard_at + self.state.settings.idle_timeout_s - time.monotonic()

    async def _handle(self, event: ClientEvent) -> None:
        match event:
            case InputAudioBufferAppend():
                await self._append(event)
            case InputAudioBufferCommit():
                await self._commit_buffer(event.event_id)
            case InputAudioBufferClear():
                self._clear_buffer()
                await self.send(InputAudioBufferCleared(event_id=new_id("event")))
            case ResponseCreate():
                await self._create_response(event)
            case ResponseCancel():
                await self._cancel_requested(event)
            case OutputAudioBufferClear():
                await self._clear_output()
            case SessionUpdate():
                await self._update(event)
            case ConversationItemCreate():
                await self._create_item(event)
            case ConversationItemTruncate():
                await self._truncate_item(event)
            case ConversationItemRetrieve():
                await self._retrieve_item(event)
            case ConversationItemDelete():
                await self._delete_item(event)

    # -- session settings ----------------------------------------------------------------

    async def _update(self, event: SessionUpdate) -> None:
        new = checked_update(self.settings, event.session, self.state.pipeline.spec, self.voices)
        if new.input_format != self.settings.input_format and self.buffered:
            raise SettingError(
                "the input format cannot change while the input buffer holds audio; "
                "commit or clear it first",
                "session.audio.input.format",
            )
        if new.truncation is not None and self.session and not self.session.deletes_turns:
            raise SettingError(
                "this pipeline's entry stage keeps a conversation it cannot rebuild, "
                'so no turns can be dropped from it; send "disabled"',
                "session.truncation",
            )
        old = self.settings
        self.settings = new
        if new.input_format != old.input_format and self.input is not None:
            self.input.rate = self.input_rate
        if new.vad != old.vad or new.input_format != old.input_format:
            self._apply_vad()
        if new.instructions != old.instructions:
            self.queue_instructions(new.instructions)
        self.queue_tools()
        if new.transcription != old.transcription:
            assert self.input is not None
            self.input.put(Op("transcribe", transcription=new.transcription))
        await self.send(SessionUpdated(event_id=new_id("event"), session=new.describe()))

    def queue_instructions(self, text: str) -> None:
        """Send new instructions to the entry stage (if it takes them), in input order."""
        if text == self.sent_instructions:
            return
        if not self._takes_instructions:
            return  # none to send: an update or item setting some was refused
        assert self.input is not None
        self.sent_instructions = text
        self.input.put(Op("instructions", text=text))

    def queue_tools(self) -> None:
        """Send the tools offered now to the entry stage (if they changed), in input order."""
        tools = template_tools(
            OfferedTool(t.name, t.description, t.parameters) for t in self.settings.offered_tools
        )
        if tools == self.sent_tools or not self._takes_tools:
            return
        assert self.input is not None
        self.sent_tools = tools
        self.input.put(Op("tools", text=tools))

    # -- the input audio buffer and items ------------------------------------------------

    def _apply_vad(self) -> None:
        """Start turn detection anew with the session's settings (or turn it off)."""
        vad = self.settings.vad
        self.turns = None if vad is None else TurnDetector(vad, self.input_rate)

    async def _append(self, event: InputAudioBufferAppend) -> None:
        """``input_audio_buffer.append``: decode, check the cap, run VAD, queue speech.

        Raises:
            AudioPayloadError: the audio is not valid base64 of the input format.
            RequestError: the input buffer would pass ``max_input_buffer_s``.
        """
        limits = self.state.settings
        samples = decode_audio(
            event.audio, self.settings.input_format, max_bytes=limits.max_append_bytes
        )
        await self._take(samples)

    async def _caller_audio(self, samples: torch.Tensor, rate: int) -> None:
        """A piece of a call's audio (int16 at ``rate``): into the input audio buffer,
        at the input format's rate, as ``input_audio_buffer.append`` would put it."""
        self.heard_at = time.monotonic()
        target = self.input_rate
        if rate != target:
            caller = self._caller
            if caller is None or (caller.source, caller.target) != (rate, target):
                caller = self._caller = StreamResampler(rate, target)
            floats = caller.push(samples.to(torch.float32) / 32768.0)
            samples = (floats * 32768.0).round().clamp(-32768, 32767).to(torch.int16)
        if not samples.numel():
            return
        async with self._acting:
            try:
                await self._take(samples)
            except RequestError as exc:
                if not self._overflowing:  # once, not every 20 ms
                    self._overflowing = True
                    await self.client_error(exc.realtime_code, str(exc), None)
                return
        self._overflowing = False

    async def _take(self, samples: torch.Tensor) -> None:
        """Audio for the input buffer: check the cap, run VAD, queue speech.

        Raises:
            RequestError: the input buffer would pass ``max_input_buffer_s``.
        """
        limits = self.state.settings
        assert self.input is not None
        held = self.buffered + self.input.queued_samples + samples.numel()
        if held > limits.max_input_buffer_s * self.input_rate:
            raise RequestError(
                f"the input buffer would hold more than {limits.max_input_buffer_s:g}s of "
                "audio (max_input_buffer_s); commit or clear it",
                realtime_code="input_audio_buffer_full",
            )
        if self.turns is None:
            self._forward(samples)
            return
        turns = self.turns
        # semantic_vad's end-of-turn model takes a tenth of a second or more of CPU at a
        # pause: it runs off the event loop, which serves every session.
        if turns.judges_pauses:
            actions = await asyncio.to_thread(turns.feed, samples)
        else:
            actions = turns.feed(samples)
        for action in actions:
            match action:
                case Forward(samples=piece):
                    self._forward(piece)
                case Started(audio_start_ms=start_ms):
                    self.pending_item = new_id("item")
                    await self.send(
                        InputAudioBufferSpeechStarted(
                            event_id=new_id("event"),
                            audio_start_ms=start_ms,
                            item_id=self.pending_item,
                        )
                    )
                    vad = self.settings.vad
                    if vad is not None and vad.interrupt_response:
                        await self._interrupt("turn_detected")
                case Stopped(audio_end_ms=end_ms):
                    item = self.pending_item or new_id("item")
                    self.pending_item = item
                    await self.send(
                        InputAudioBufferSpeechStopped(
                            event_id=new_id("event"), audio_end_ms=end_ms, item_id=item
                        )
                    )
                    if self.buffered:
                        await self._commit_buffer(None)
                        vad = self.settings.vad
                        if vad is not None and vad.create_response and self.active is None:
                            await self._start_response(None, None)
                case TimedOut(audio_start_ms=start_ms, audio_end_ms=end_ms):
                    if self.active is not None:
                        continue  # a reply asked for meanwhile: nobody is waiting
                    item = self.pending_item or new_id("item")
                    self.pending_item = item
                    await self.send(
                        InputAudioBufferTimeoutTriggered(
                            event_id=new_id("event"),
                            audio_start_ms=start_ms,
                            audio_end_ms=end_ms,
                            item_id=item,
                        )
                    )
                    if self.buffered:
                        await self._commit_buffer(None)
                    await self._start_response(None, None)

    def _forward(self, samples: torch.Tensor) -> None:
        assert self.input is not None
        if samples.numel():
            self.buffered += samples.numel()
            self.held.append(samples)
            self.input.put(Op("audio", samples=samples))

    async def _commit_buffer(self, event_id: str | None) -> None:
        """Make the buffer a user item (``committed``, ``item.added``/``done``).

        Raises:
            RequestError: the buffer is empty (``input_audio_buffer_commit_empty``).
        """
        if not self.buffered:
            raise RequestError(
                "the input audio buffer is empty: append audio before committing",
                realtime_code="input_audio_buffer_commit_empty",
            )
        assert self.input is not None
        item_id = self.pending_item or new_id("item")
        self.pending_item = None
        self._transcribe(item_id, self.buffered)
        self.buffered = 0
        self.held = []
        self.input.put(Op("commit", event_id=event_id, turn=item_id))
        item = ConversationItem(
            id=item_id,
            role="user",
            status="completed",
            content=[ItemContent(type="input_audio", transcript=None)],
        )
        previous, added = self.items.add(item)
        committed = InputAudioBufferCommitted(
            event_id=new_id("event"), item_id=item_id, previous_item_id=previous
        )
        await self.send_all([committed, *added])

    def _transcribe(self, item_id: str, samples: int) -> None:
        """User item ``item_id`` holds ``samples`` of audio: while transcription is on,
        its transcript is due."""
        if samples and self.settings.transcription is not None:
            self.transcribing[item_id] = samples / self.input_rate

    async def _transcript(self, event: TranscriptDelta | TranscriptDone | TranscriptFailed) -> None:
        """A piece of a user item's transcript, the whole of it, or its failure, from
        the pipeline's transcriber."""
        if isinstance(event, TranscriptDelta):
            self.transcribed[event.item] = self.transcribed.get(event.item, "") + event.delta
            await self.send(
                ConversationItemTranscriptionDelta(
                    event_id=new_id("event"), item_id=event.item, delta=event.delta
                )
            )
            return
        told = self.transcribed.pop(event.item, None)
        if isinstance(event, TranscriptDone):
            seconds = self.transcribing.pop(event.item, 0.0)
            if told is None:  # a transcriber that does not stream: the whole, in one
                await self.send(
                    ConversationItemTranscriptionDelta(
                        event_id=new_id("event"), item_id=event.item, delta=event.transcript
                    )
                )
            await self.send(
                ConversationItemTranscriptionCompleted(
                    event_id=new_id("event"),
                    item_id=event.item,
                    transcript=event.transcript,
                    usage=TranscriptionUsage(seconds=seconds),
                )
            )
            return
        # No item: the transcriber failed every item it had not transcribed yet.
        items = [event.item] if event.item else list(self.transcribing)
        error = ErrorDetail(type="server_error", code=event.code, message=event.message)
        for item in items:
            self.transcribing.pop(item, None)
            self.transcribed.pop(item, None)
            await self.send(
                ConversationItemTranscriptionFailed(
                    event_id=new_id("event"), item_id=item, error=error
                )
            )

    def _clear_buffer(self) -> None:
        """``input_audio_buffer.clear``: drop the buffer here, in VAD and on every stage."""
        assert self.input is not None
        self.buffered = 0
        self.held = []
        self.pending_item = None
        if self.turns is not None:
            self.turns.clear()
        self.input.put(Op("clear"))

    async def _create_item(self, event: ConversationItemCreate) -> None:
        """``conversation.item.create``: a user item becomes a committed turn, an
        assistant item an earlier reply (``Session.add_reply``), a system item sets the
        instructions; ``function_call`` and ``function_call_output`` items give back a
        tool call (an earlier reply that called it) and answer one.

        Raises:
            RequestError: another item type or role, an empty item, content the role
                cannot hold, audio still in the buffer, or an id already in the
                conversation.
        """
        item = event.item
        item_id = item.id or new_id("item")
        if item_id in self.items:
            raise RequestError(
                f"item {item_id!r} is already in the conversation; give a new id",
                realtime_code="invalid_value",
                param="item.id",
            )
        if item.type == "function_call_output":
            await self._add_tool_result(event, item_id)
            return
        if item.type == "function_call":
            await self._add_tool_call(event, item_id)
            return
        if item.type != "message":
            raise RequestError(
                f"items of type {item.type!r} are not supported; send message or "
                "function_call_output items"
            )
        texts = [p.text for p in item.content if p.type in ("input_text", "text") and p.text]
        audios = [p.audio for p in item.content if p.type == "input_audio" and p.audio]
        if item.role == "system":
            if audios or not texts:
                raise RequestError("a system item holds input_text content only")
            if not self._takes_instructions:
                raise RequestError(
                    "this pipeline's entry stage takes no instructions, so a system item "
                    "would be ignored: send user and assistant items only",
                    param="item.role",
                )
            self.settings = replace(self.settings, instructions="\n".join(texts))
            self.queue_instructions(self.settings.instructions)
        elif item.role in ("user", "assistant"):
            if self.buffered:
                raise RequestError(
                    "the input audio buffer holds uncommitted audio; commit or clear it "
                    "before adding an item"
                )
            assert self.input is not None
            if item.role == "assistant":
                said = self._reply_text(item)
                self.input.put(Op("reply", event_id=event.event_id, text=said, turn=item_id))
                self.last_response = None  # a truncation can cut only the last reply
            else:
                if not texts and not audios:
                    raise RequestError("a user item needs input_text or input_audio content")
                limit = self.state.settings.max_append_bytes
                decoded = [
                    decode_audio(a, self.settings.input_format, max_bytes=limit) for a in audios
                ]
                for text in texts:
                    self.input.put(Op("text", event_id=event.event_id, text=text))
                for samples in decoded:
                    self.input.put(Op("audio", event_id=event.event_id, samples=samples))
                self._transcribe(item_id, sum(samples.numel() for samples in decoded))
                self.input.put(Op("commit", event_id=event.event_id, turn=item_id))
        else:
            raise RequestError(
                f"items with role {item.role!r} cannot be added; add user, assistant or "
                "system items",
                param="item.role",
            )
        content = [
            ItemContent(type=p.type, text=p.text, transcript=p.transcript) for p in item.content
        ]
        role: Literal["user", "assistant", "system"] = (
            "assistant"
            if item.role == "assistant"
            else "system"
            if item.role == "system"
            else "user"
        )
        added = ConversationItem(id=item_id, role=role, status="completed", content=content)
        await self.send_all(self.items.add(added)[1])

    async def _add_tool_call(self, event: ConversationItemCreate, item_id: str) -> None:
        """A ``function_call`` item: an assistant turn that called a tool, given back (a
        client restoring a conversation), taken as the chat template writes it.

        Raises:
            RequestError: the pipeline takes no tools, no ``name``, ``arguments`` that are
                not JSON, or audio still in the buffer.
        """
        item = event.item
        if not self._takes_tools:
            raise RequestError(
                "this pipeline's entry stage takes no tools: function_call items cannot be added",
                param="item.type",
            )
        if not item.name:
            raise RequestError("a function_call item needs the function's name", param="item.name")
        arguments = item.arguments or "{}"
        try:
            json.loads(arguments)
        except ValueError as exc:
            raise RequestError(
                f"a function_call item's arguments must be JSON ({exc})", param="item.arguments"
            ) from None
        if self.buffered:
            raise RequestError(
                "the input audio buffer holds uncommitted audio; commit or clear it "
                "before adding an item"
            )
        call_id = item.call_id or new_call_id()
        self.items.calls[call_id] = item.name
        function = {"name": item.name, "arguments": arguments}
        calls = json.dumps([{"type": "function", "function": function}])
        assert self.input is not None
        self.input.put(Op("reply", event_id=event.event_id, calls=calls, turn=item_id))
        self.last_response = None  # a truncation can cut only the last reply
        added = FunctionCallItem(
            id=item_id,
            call_id=call_id,
            name=item.name,
            arguments=arguments,
            status="completed",
        )
        await self.send_all(self.items.add(added)[1])

    async def _add_tool_result(self, event: ConversationItemCreate, item_id: str) -> None:
        """A ``function_call_output`` item: the result of one of the model's calls, a
        user turn of the conversation (as the chat template renders a tool's result).

        Raises:
            RequestError: no ``call_id`` of a call the model made, no ``output``, or audio
                still in the buffer.
        """
        item = event.item
        if item.call_id is None or item.call_id not in self.items.calls:
            raise RequestError(
                f"call_id {item.call_id!r} is not a call the model made in this session; "
                "answer a function_call item's call_id",
                param="item.call_id",
            )
        if item.output is None:
            raise RequestError("a function_call_output item needs its output", param="item.output")
        if self.buffered:
            raise RequestError(
                "the input audio buffer holds uncommitted audio; commit or clear it "
                "before adding an item"
            )
        assert self.input is not None
        self.input.put(Op("tool_result", event_id=event.event_id, text=item.output))
        self.input.put(Op("commit", event_id=event.event_id, turn=item_id))
        added = FunctionCallOutputItem(id=item_id, call_id=item.call_id, output=item.output)
        await self.send_all(self.items.add(added)[1])

    def _reply_text(self, item: ItemParam) -> str:
        """An assistant item's words: its text parts' and its audio parts' transcripts,
        in order. The audio itself is not the model's input: its context holds the words
        it said (a reply it generated is kept so too).

        Raises:
            RequestError: the pipeline keeps no conversation it can take a reply in, a
                part is not an assistant's, or an audio part has no transcript.
        """
        if REPLY_FIELD not in self.state.pipeline.spec.entry_inputs():
            raise RequestError(
                "this pipeline's entry stage keeps no conversation it can be given an "
                "assistant item in; add user or system items",
                param="item.role",
            )
        words: list[str] = []
        for j, part in enumerate(item.content):
            if part.type in ("output_text", "text"):
                words.append(part.text or "")
            elif part.type in ("output_audio", "audio"):
                if part.transcript is None:
                    raise RequestError(
                        "an assistant audio part needs its transcript: the model takes "
                        "back the words it said, not audio",
                        param=f"item.content[{j}].transcript",
                    )
                words.append(part.transcript)
            else:
                raise RequestError(
                    f"an assistant item holds output_text or output_audio content, not "
                    f"{part.type!r}",
                    param=f"item.content[{j}].type",
                )
        if not words:
            raise RequestError(
                "an assistant item needs output_text or output_audio (with its transcript) content",
                param="item.content",
            )
        return "".join(words)

    async def _truncate_item(self, event: ConversationItemTruncate) -> None:
        """``conversation.item.truncate``: cut the last reply to ``audio_end_ms``; once
        every stage has taken it, the item holds what the user heard and
        ``conversation.item.truncated`` says so (:meth:`_truncated`).

        Raises:
            RequestError: not the last assistant item, or ``audio_end_ms`` outside its
                audio.
        """
        reply = self.last_response
        if reply is None or reply.item_id != event.item_id:
            raise RequestError(
                f"item {event.item_id!r} is not the last assistant item; only it can be truncated",
                realtime_code="item_truncate_invalid_item_id",
            )
        if event.audio_end_ms < 0 or event.audio_end_ms > reply.audio_ms + 1:
            raise RequestError(
                f"audio_end_ms must be in [0, {reply.audio_ms:.0f}] (the item's audio), "
                f"got {event.audio_end_ms}",
                realtime_code="invalid_value",
            )
        if reply is self.active:
            # The user stopped listening while it was still being generated (a client
            # truncates as soon as it hears the user speak): it ends here, and the cut
            # applies once every stage has let it go.
            await self._cancel_response(reply, "client_cancelled")
        assert self.input is not None
        self.input.put(
            Op(
                "truncate",
                event_id=event.event_id,
                audio_ms=event.audio_end_ms,
                stream=reply,
                content_index=event.content_index,
            )
        )

    async def _truncated(self, op: Op, heard: str | None) -> None:
        """A truncate was taken: the item's transcript becomes what the user heard, as
        OpenAI's truncate leaves no text the user did not hear (none when the text
        heard is not known); then ``conversation.item.truncated``."""
        assert op.stream is not None
        self.items.truncated(op.stream.item_id, heard or "")
        await self.send(
            ConversationItemTruncated(
                event_id=new_id("event"),
                item_id=op.stream.item_id,
                content_index=op.content_index,
                audio_end_ms=op.audio_ms,
            )
        )

    async def _retrieve_item(self, event: ConversationItemRetrieve) -> None:
        """``conversation.item.retrieve``: the item as the server holds it (audio is not
        echoed back; an input audio item's transcript is null).

        Raises:
            RequestError: no such item in the conversation.
        """
        item = self.items.get(event.item_id)
        if item is None:
            raise RequestError(
                f"item {event.item_id!r} is not in the conversation",
                realtime_code="item_retrieve_invalid_item_id",
                param="item_id",
            )
        await self.send(ConversationItemRetrieved(event_id=new_id("event"), item=item))

    async def _delete_item(self, event: ConversationItemDelete) -> None:
        """``conversation.item.delete``: no later response sees the item.

        A user or assistant item is taken out of the conversation on every stage
        (``Session.delete``: the stages replay the conversation without it). A system
        item's instructions stop applying if they are still the session's.

        Raises:
            RequestError: no such item, a response in flight (the stages hold it as
                part of the conversation: cancel it or wait for its ``response.done``;
                the code is the one OpenAI's service gives a conflicting
                ``response.create``), or a pipeline whose entry stage cannot rebuild its
                conversation.
        """
        item_id = event.item_id
        item = self.items.get(item_id)
        if item is None:
            raise RequestError(
                f"item {item_id!r} is not in the conversation",
                realtime_code="item_delete_invalid_item_id",
                param="item_id",
            )
        if self.active is not None:
            raise RequestError(
                f"response {self.active.id} is in flight; cancel it or wait for its "
                "response.done before deleting an item",
                realtime_code="conversation_already_has_active_response",
            )
        if (reply := self.items.reply_of_call(item_id)) is not None:
            raise RequestError(
                f"item {item_id!r} is a function call of the reply in item "
                f"{reply!r}, one assistant turn with it: delete that item, "
                "which takes the reply out with its calls",
                realtime_code="item_delete_unsupported",
                param="item_id",
            )
        assert self.session is not None
        assert self.input is not None
        if isinstance(item, ConversationItem) and item.role == "system":
            said = "\n".join(p.text for p in item.content if p.text)
            if said == self.settings.instructions:
                self.settings = replace(self.settings, instructions="")
                self.queue_instructions("")
        elif not self.session.deletes_turns:
            raise RequestError(
                "this pipeline's entry stage keeps a conversation it cannot rebuild, so "
                "items cannot be taken out of it",
                realtime_code="item_delete_unsupported",
                param="item_id",
            )
        else:
            self.input.put(Op("delete", event_id=event.event_id, turn=self.items.turn_of(item_id)))
        await self.send_all(self._removed(item_id))

    def _removed(self, item_id: str) -> list[ServerEvent]:
        """Take ``item_id`` (with its reply's calls) out of what the server holds; the
        ``conversation.item.deleted`` events saying so."""
        gone = self.items.remove(item_id)  # the reply's calls go with it
        self.tokens.forget(set(gone))
        if self.last_response is not None and self.last_response.item_id == item_id:
            self.last_response = None
        return [ConversationItemDeleted(event_id=new_id("event"), item_id=g) for g in gone]

    async def _retain(self, stream: ResponseStream) -> None:
        """After a reply: with a retention ratio, past its limit, take the oldest turns
        out as ``conversation.item.delete`` does (``truncation.py``), told by
        ``conversation.item.deleted``."""
        self.tokens.measured(stream.item_id, stream.usage.total)
        retention = self.settings.truncation
        cut = None if retention is None else self.tokens.cut(retention)
        if cut is None or self.active is not None or self.input is None:
            return
        assert self.session is not None
        if not self.session.deletes_turns:  # refused by session.update; a key's config
            self.log.warning("truncation: this pipeline cannot drop turns; none dropped")
            return
        events: list[ServerEvent] = []
        for item_id in self.items.oldest_through(cut):
            if item_id in self.items:
                self.input.put(Op("delete", turn=self.items.turn_of(item_id)))
                events += self._removed(item_id)
        await self.send_all(events)

    # -- responses -------------------------------------------------------------------------

    async def _create_response(self, event: ResponseCreate) -> None:
        """``response.create``.

        Raises:
            RequestError: a response is in flight
                (``conversation_already_has_active_response``).
        """
        if self.active is not None:
            raise RequestError(
                f"response {self.active.id} is in flight; cancel it or wait for its response.done",
                realtime_code="conversation_already_has_active_response",
            )
        await self._start_response(event, event.event_id)

    async def _start_response(self, event: ResponseCreate | None, event_id: str | None) -> None:
        """Start a response (from ``response.create``, or from server VAD with no event):
        queue it on the input stream, send its opening events.

        The input audio buffer stays as it is, as with OpenAI's service: what of it the
        stages have prefilled is cleared before the response and sent again after it,
        still uncommitted.

        Raises:
            RequestError: ``response.conversation`` other than ``auto`` or ``none``,
                ``none`` on a pipeline that cannot take its reply back out,
                ``response.input`` (a context of its own is not supported),
                ``response.instructions`` or ``response.tools`` on a pipeline that
                takes none, or tools it cannot offer (``SessionSettings.for_response``).
        """
        params = event.response if event is not None else None
        out_of_band = self._out_of_band(params)
        settings = self.settings.for_response(params, self.voices)
        if settings.instructions is not None and not self._takes_instructions:
            raise RequestError(
                "this pipeline's entry stage takes no instructions, so a response cannot "
                "be given its own",
                param="response.instructions",
            )
        if settings.tools is not None and not self._takes_tools:
            raise RequestError(
                "this pipeline's entry stage takes no tools, so a response cannot be given its own",
                param="response.tools",
            )
        offered = self.settings.offered_tools if settings.tools is None else settings.tools
        assert self.input is not None
        held = self.held if self.buffered else []
        if held:
            self.input.put(Op("clear"))
        stream = ResponseStream(
            new_id("resp"),
            new_id("item"),
            settings,
            source_rate=self.source_rate,
            event_id=lambda: new_id("event"),
            conversation_id=None if out_of_band else self.conversation_id,
            metadata=params.metadata if params is not None else None,
            tools=[t.name for t in offered] if self._takes_tools else None,
            item_ids=lambda: new_id("item"),
            reply_stage=self.state.pipeline.spec.reply_stage,
        )
        self.active = stream
        self.streams[stream.id] = stream
        opening = stream.opening()
        if out_of_band:
            self.out_of_band.add(stream.id)
        else:
            self.last_response = stream
            self.items.reply_started(stream.item_id, stream.id, opening)
        self.input.put(Op("respond", event_id=event_id, stream=stream))
        for samples in held:
            self.input.put(Op("audio", samples=samples))
        self.log.info("session %s response %s created", self.settings.id, stream.id)
        await self.send_all(opening)

    def _out_of_band(self, params: ResponseParams | None) -> bool:
        """Whether ``response.create`` asks for a response outside the conversation.

        Raises:
            RequestError: see :meth:`_start_response`.
        """
        if params is None:
            return False
        if params.input is not None:
            raise RequestError(
                "response.input is not supported: a response answers the conversation "
                "(delete items, or use conversation: none, to change what it sees)",
                param="response.input",
            )
        if params.conversation in (None, "auto"):
            return False
        if params.conversation != "none":
            raise RequestError(
                f"response.conversation must be 'auto' or 'none', got {params.conversation!r}",
                realtime_code="invalid_value",
                param="response.conversation",
            )
        assert self.session is not None
        if not self.session.deletes_turns:
            raise RequestError(
                "this pipeline's entry stage keeps a conversation it cannot rebuild, so a "
                "response cannot be kept out of it",
                param="response.conversation",
            )
        return True

    async def _cancel_requested(self, event: ResponseCancel) -> None:
        """``response.cancel``; in a call, also of a reply generated but still playing
        (it stops, cut to what was heard).

        Raises:
            RequestError: no response (or not the one named) is in flight, or playing.
        """
        active = self.active
        reply = self.last_response
        if (
            active is None
            and reply is not None
            and self.audio is not None
            and event.response_id in (None, "", reply.id)
            and self.audio.playing(reply.id)
        ):
            await self._interrupt("client_cancelled")
            return
        if active is None or (event.response_id and event.response_id != active.id):
            raise RequestError(
                "no response is in flight"
                if active is None
                else f"response {event.response_id!r} is not in flight ({active.id} is)",
                realtime_code="response_cancel_not_active",
            )
        await self._interrupt("client_cancelled")

    async def _clear_output(self) -> None:
        """``output_audio_buffer.clear``: in a call, stop the reply playing (and the
        response in flight) and cut its item to what the caller heard, as a barge-in
        does; ``output_audio_buffer.cleared`` says so (at once if nothing was playing).

        Raises:
            RequestError: not a call (on a websocket the client plays the audio).
        """
        if self.audio is None:
            raise RequestError(
                "output_audio_buffer.clear is for WebRTC calls: on a websocket the client "
                "holds the audio it plays (stop it there, then conversation.item.truncate)",
                realtime_code="invalid_value",
            )
        reply = self.last_response
        playing = reply is not None and self.audio.playing(reply.id)
        if playing or self.active is not None:
            await self._interrupt("client_cancelled")
        if not playing:
            await self.send(
                OutputAudioBufferCleared(
                    event_id=new_id("event"), response_id=reply.id if reply is not None else ""
                )
            )

    async def _interrupt(self, reason: CancelReason) -> None:
        """Cancel the response in flight (a barge-in, ``response.cancel``); in a call,
        stop the reply playing too, and cut its item to what the caller heard of it,
        as the client's ``conversation.item.truncate`` would (:meth:`_truncated`)."""
        reply = self.last_response
        heard: float | None = None
        if self.audio is not None:
            # Stopped first: while the stages let the reply go, the caller hears no more.
            if self.active is not None and self.active is not reply:
                self.audio.cut(self.active.id)  # out of band: nothing to cut
            if reply is not None:
                heard = self.audio.cut(reply.id)
        if self.active is not None:
            await self._cancel_response(self.active, reason)
        if heard is None or reply is None or reply.response is None:
            return  # nothing playing, or a reply that never started: nothing to cut
        assert self.input is not None
        heard_ms = min(int(heard), int(reply.audio_ms))
        self.log.info(
            "session %s response %s cut at %d ms heard", self.settings.id, reply.id, heard_ms
        )
        self.input.put(Op("truncate", audio_ms=heard_ms, stream=reply))

    async def _cancel_response(self, stream: ResponseStream, reason: CancelReason) -> None:
        """Cancel ``stream`` for ``reason``: stop it on every stage (no delta follows)."""
        if stream.cancel_reason is not None:
            return
        stream.cancel_reason = reason
        self.log.info("session %s response %s cancelled (%s)", self.settings.id, stream.id, reason)
        if stream.response is not None:
            await self._stop(stream)
        # Not started yet: the input stream finishes it when it reaches it, or stops it
        # once it has started it.

    async def _stop(self, stream: ResponseStream) -> None:
        """Stop ``stream``'s response on every stage; its ``response.done`` follows.

        It comes with the pipeline's ``ResponseDone``, unless the stages do not end the
        response within the cancel's deadline (a stage is stuck, and the session's own
        deadlines will end it): then it is sent now, so that a cancel is always answered.
        """
        assert stream.response is not None
        try:
            await stream.response.cancel()
        except CancelTimeoutError as exc:
            self.log.warning("session %s response %s: %s", self.settings.id, stream.id, exc)
            if not stream.ended:
                error = ErrorDetail(type="server_error", code=exc.code, message=str(exc))
                await self._finish(stream, None, error)

    async def _refused(self, error: OmniError, op: Op) -> None:
        """The session refused a queued operation: a response fails; else an ``error``."""
        if op.kind == "respond" and op.stream is not None:
            code, message = (
                described(error)
                if isinstance(error, InvalidRequestError)
                else (error.code, str(error))
            )
            await self._finish(
                op.stream, None, ErrorDetail(type="server_error", code=code, message=message)
            )
            return
        if isinstance(error, InvalidRequestError):
            await self.client_error(*described(error), op.event_id)
        else:
            await self.client_error(error.code, str(error), op.event_id)

    async def _finish(
        self, stream: ResponseStream, done: PipelineResponseDone | None, error: ErrorDetail | None
    ) -> None:
        """Send ``stream``'s closing events (from ``done``, or a failure with ``error``),
        then ``rate_limits.updated``; an out-of-band response's reply is taken back out
        of the conversation on the stages."""
        closing = stream.done(done, error)
        in_conversation = stream.id not in self.out_of_band
        if self.audio is not None:
            self.audio.end(stream.id)
        if stream.id in self.out_of_band:
            self.out_of_band.discard(stream.id)
            if done is not None and self.input is not None:
                self.input.put(Op("delete", turn=stream.id))
        else:
            self.items.reply_done(stream.item_id, closing, stream.calls)
            if self.turns is not None:
                self.turns.reply_ended(stream.audio_ms)
        await self.send_all(closing)
        await self.send(self._rate_limits())
        if stream.failure is not None:
            status = "failed"  # a malformed tool call: stopped as a cancel, failed
        elif stream.cancel_reason:
            status = "cancelled"
        else:
            status = done.status if done else "failed"
        self.state.metrics.response_done(status, done.metrics if done else None)
        self.streams.pop(stream.id, None)
        if self.active is stream:
            self.active = None
        self.state.response_ended.set()
        if in_conversation and status in ("completed", "incomplete"):
            await self._retain(stream)

    def _rate_limits(self) -> RateLimitsUpdated:
        """The server's limits as they stand: its session slots (see ``RateLimit``)."""
        limit = self.state.max_sessions
        return RateLimitsUpdated(
            event_id=new_id("event"),
            rate_limits=[
                RateLimit(name="requests", limit=limit, remaining=max(0, limit - self.state.active))
            ],
        )

    async def _on_event(self, event: Event) -> None:
        """One event of the session, from the event pump."""
        match event:
            case TextDelta(response=rid, text=text):
                stream = self.streams.get(rid)
                if stream is not None:
                    await self._on_text(stream, text)
            case AudioDelta(response=rid, audio=audio):
                stream = self.streams.get(rid)
                if stream is not None:
                    if self.audio is not None and stream.speaking:
                        self.audio.play(stream.id, audio, self.source_rate)
                    await self.send_all(stream.on_audio(audio))
            case PipelineResponseDone(response=rid):
                stream = self.streams.get(rid)
                if stream is not None:
                    await self._finish(stream, event, None)
            case TranscriptDelta() | TranscriptDone() | TranscriptFailed():
                await self._transcript(event)
            case SessionError(code=code, message=message):
                await self._session_ended(code, message)
            case Aborted(reason=reason):
                await self._session_ended("aborted", reason)
            case Done():
                await self._session_ended("internal", "the session finished")

    async def _on_text(self, stream: ResponseStream, text: str) -> None:
        """A text delta of ``stream``; a malformed tool call in it fails the response
        (closed: it is stopped on every stage, and nothing more of it is sent)."""
        try:
            events = stream.on_text(text)
        except MalformedToolCallError as exc:
            self.log.warning("session %s response %s: %s", self.settings.id, stream.id, exc)
            stream.fail(tool_call_error(exc))
            if stream.response is not None:
                await self._stop(stream)
            return
        last = stream.last_item_id if stream.calls and self.last_response is stream else None
        self.items.calls_made(stream.calls, last)
        await self.send_all(events)

    async def _session_ended(self, code: str, message: str) -> None:
        """The session ended: what was in flight failed with it; the client is told."""
        detail = ErrorDetail(type="server_error", code=code, message=message)
        for stream in list(self.streams.values()):
            await self._finish(stream, None, detail)
        if not self.closing:
            await self.fail(code, f"the session ended: {message}", close_code=_CLOSE_INTERNAL)

    # -- the event pump ----------------------------------------------------------------------

    async def _pump(self) -> None:
        assert self.session is not None
        async for event in self.session:
            await self._on_event(event)
            if isinstance(event, TERMINAL):
                return


async def new_session_settings(state: ServerState, config: SessionConfig) -> SessionSettings:
    """The settings a new session of ``state``'s server starts with: the defaults with
    ``config`` applied, checked as a ``session.update`` is.

    Raises:
        RequestError: a setting the server does not serve (``param`` names it).
    """
    voices = await state.voices()
    base = SessionSettings(
        id=new_id("sess"), model=served_name(state), created_at=time.time(), voice=voices.default
    )
    return checked_update(base, config, state.pipeline.spec, voices)


def checked_update(
    current: SessionSettings, config: SessionConfig, spec: PipelineSpec, voices: VoiceMap
) -> SessionSettings:
    """``current`` with ``config`` applied, refused where ``spec``'s entry stage cannot
    take what it sets (instructions, tools).

    Raises:
        RequestError: a setting the server does not serve (``param`` names it).
    """
    new = current.updated(config, voices, _transcribers(spec))
    changed = new.instructions and new.instructions != current.instructions
    if changed and INSTRUCTIONS_FIELD not in spec.entry_inputs():
        raise SettingError(
            "this pipeline's entry stage takes no instructions (its engine does not "
            f"declare {INSTRUCTIONS_FIELD!r} among its inputs): send none, or serve a "
            "model that follows them",
            "session.instructions",
        )
    if new.offered_tools and TOOLS_FIELD not in spec.entry_inputs():
        raise SettingError(
            "this pipeline's entry stage takes no tools (its engine does not declare "
            f"{TOOLS_FIELD!r} among its inputs): send no tools, or serve a model that "
            "calls them",
            "session.tools",
        )
    return new


def _transcribers(spec: PipelineSpec) -> tuple[str, ...]:
    """The transcription models the pipeline serves: its transcriber's model (what its
    ``model`` argument names, or its engine's default) and its stage's name; none
    without a transcriber."""
    stage = spec.outputs.transcript
    if stage is None:
        return ()
    engine = spec.stage(stage).engine
    model = engine.args.get("model")
    if not isinstance(model, str):
        family = family_of_kind(engine.kind)
        model = family.default_model if family is not None else None
    return tuple(dict.fromkeys(name for name in (model, stage) if name))
