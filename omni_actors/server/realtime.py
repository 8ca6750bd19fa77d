"""``RealtimeConnection``: one websocket on ``/v1/realtime``, one conversation session.

The connection owns three tasks and waits for the first to end: the reader (client
events, acted on at once and never blocked by the pipeline), the input stream (queued
input handed to the session in order, ``input_stream.py``) and the event pump (the
session's events turned into Realtime events, ``response_stream.py``). When one ends —
the client went away, the session ended, the server is shutting down — the others are
cancelled and the session is aborted on every stage: a connection leaves nothing
behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import replace

import msgspec
import torch
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_actors.errors import InvalidRequestError, OmniError
from omni_actors.protocols.events import (
    TERMINAL,
    Aborted,
    AudioDelta,
    Done,
    Event,
    SessionError,
    TextDelta,
)
from omni_actors.protocols.events import ResponseDone as PipelineResponseDone
from omni_actors.protocols.realtime_client import (
    ClientEvent,
    ClientEventError,
    ConversationItemCreate,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    decode_client_event,
)
from omni_actors.protocols.realtime_server import (
    BETA_NAMES,
    ConversationItem,
    ConversationItemAdded,
    ConversationItemDone,
    ConversationItemTruncated,
    ErrorDetail,
    ErrorEvent,
    InputAudioBufferCleared,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    ItemContent,
    ServerEvent,
    SessionCreated,
    SessionUpdated,
)
from omni_actors.server.audio_format import AudioPayloadError, decode_audio, format_rate
from omni_actors.server.input_stream import INSTRUCTIONS_FIELD, InputStream, Op
from omni_actors.server.request_error import RequestError
from omni_actors.server.response_stream import CancelReason, ResponseStream
from omni_actors.server.session_config import SessionSettings, SettingError
from omni_actors.server.state import ServerState
from omni_actors.server.turns import Forward, Started, Stopped, TurnDetector
from omni_actors.serving.session import Session

__all__ = ["RealtimeConnection"]

log = logging.getLogger(__name__)

_SEND_TIMEOUT_S = 30.0  # a client that reads nothing for this long is dropped
_CLOSE_GOING_AWAY = 1001
_CLOSE_INTERNAL = 1011
_CLOSE_TRY_LATER = 1013

_encoder = msgspec.json.Encoder()


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class RealtimeConnection:
    """One realtime session over an accepted websocket (see the module docstring).

    Args:
        websocket: the accepted connection.
        state: the server's shared state.
        beta: the client asked for the beta protocol (``OpenAI-Beta: realtime=v1``):
            events go out under their beta names.
    """

    def __init__(self, websocket: WebSocket, state: ServerState, *, beta: bool = False) -> None:
        self.ws = websocket
        self.state = state
        self.beta = beta
        spec = state.pipeline.spec
        self.settings = SessionSettings(
            id=_new_id("sess"), model=state.settings.model or spec.name, created_at=time.time()
        )
        self.log = logging.LoggerAdapter(log, {"session": self.settings.id})
        self.session: Session | None = None
        self._input: InputStream | None = None
        self._turns: TurnDetector | None = None
        self._source_rate = spec.outputs.sample_rate
        self._takes_instructions = INSTRUCTIONS_FIELD in spec.ports(spec.entry_stage).inputs
        self._sent_instructions = ""
        self._responses: dict[str, ResponseStream] = {}
        self.active: ResponseStream | None = None  # the response in flight
        self._last_reply: ResponseStream | None = None  # the last assistant item
        self._last_item: str | None = None
        self._pending_item: str | None = None  # the user item being spoken or appended
        self._buffered = 0  # samples appended since the last commit or clear
        self._conversation_id = _new_id("conv")
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------

    async def serve(self) -> None:
        """Run the session until the client leaves, the session ends or the server stops."""
        state = self.state
        session = state.pipeline.session(modalities=("text", "audio"), session_id=self.settings.id)
        self.session = session
        state.connections.add(self)
        state.metrics.session_opened()
        try:
            error = await session.open()
            if error is not None:
                await self.fail(error.code, error.message, close_code=_CLOSE_TRY_LATER)
                return
            self._input = InputStream(session, self._input_rate, self._input_refused)
            self._apply_vad()
            await self.send(
                SessionCreated(event_id=self._event_id(), session=self.settings.describe())
            )
            if self.settings.instructions:
                self._queue_instructions(self.settings.instructions)
            tasks = [
                asyncio.create_task(self._read(), name=f"realtime {self.settings.id} reader"),
                asyncio.create_task(self._input.run(), name=f"realtime {self.settings.id} input"),
                asyncio.create_task(self._pump(), name=f"realtime {self.settings.id} events"),
            ]
            try:
                _done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, WebSocketDisconnect):
                    self.log.error(
                        "session %s failed: %r", self.settings.id, result, exc_info=result
                    )
        finally:
            await session.close()
            state.connections.discard(self)
            state.metrics.session_closed()
            if self.ws.application_state == WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await self.ws.close(_CLOSE_INTERNAL if not self._closing else _CLOSE_GOING_AWAY)
            self.log.info("session %s closed", self.settings.id)

    @property
    def _input_rate(self) -> int:
        return format_rate(self.settings.input_format)

    async def shut_down(self, message: str) -> None:
        """The server is stopping: a final ``error`` event, then a close frame (1001)."""
        self._closing = True
        await self.fail("server_shutting_down", message, close_code=_CLOSE_GOING_AWAY)

    async def fail(self, code: str, message: str, *, close_code: int) -> None:
        """Tell the client why the session ends (an ``error`` event) and close."""
        self.state.metrics.error(code)
        with contextlib.suppress(Exception):
            await self.send(
                ErrorEvent(
                    event_id=self._event_id(),
                    error=ErrorDetail(type="server_error", code=code, message=message),
                )
            )
            await self.ws.close(close_code, reason=message[:120])

    # -- sending -----------------------------------------------------------------------

    def _event_id(self) -> str:
        return _new_id("event")

    async def send(self, event: ServerEvent) -> None:
        """Send one event (under its beta name for a beta client), within a deadline."""
        data = _encoder.encode(event)
        name = event.__struct_config__.tag
        assert isinstance(name, str)
        if self.beta and name in BETA_NAMES:
            # msgspec writes the tag first: swap the name without decoding the event.
            data = b'{"type":"%s"' % BETA_NAMES[name].encode() + data[len(name) + 10 :]
        async with asyncio.timeout(_SEND_TIMEOUT_S):
            await self.ws.send_text(data.decode())
        self.state.metrics.sent(name)

    async def _send_all(self, events: list[ServerEvent]) -> None:
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
                event_id=self._event_id(),
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
                async with asyncio.timeout(limits.idle_timeout_s):
                    message = await self.ws.receive()
            except TimeoutError:
                await self.fail(
                    "idle_timeout",
                    f"no client event for {limits.idle_timeout_s:g}s (idle_timeout_s)",
                    close_code=1000,
                )
                return
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("text")
            if data is None:
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
                await self._handle(event)
            except InvalidRequestError as exc:
                await self.client_error(
                    *_described(exc), event.event_id, getattr(exc, "param", None)
                )

    async def _handle(self, event: ClientEvent) -> None:
        match event:
            case InputAudioBufferAppend():
                await self._append(event)
            case InputAudioBufferCommit():
                await self._commit(event.event_id)
            case InputAudioBufferClear():
                self._clear()
                await self.send(InputAudioBufferCleared(event_id=self._event_id()))
            case ResponseCreate():
                await self._create_response(event)
            case ResponseCancel():
                await self._cancel_response(event)
            case SessionUpdate():
                await self._update(event)
            case ConversationItemCreate():
                await self._create_item(event)
            case ConversationItemTruncate():
                await self._truncate(event)

    # -- session settings ----------------------------------------------------------------

    async def _update(self, event: SessionUpdate) -> None:
        new = self.settings.updated(event.session)
        if new.input_format != self.settings.input_format and self._buffered:
            raise SettingError(
                "the input format cannot change while the input buffer holds audio; "
                "commit or clear it first",
                "session.audio.input.format",
            )
        old = self.settings
        self.settings = new
        if new.input_format != old.input_format and self._input is not None:
            self._input.rate = self._input_rate
        if new.vad != old.vad or new.input_format != old.input_format:
            self._apply_vad()
        if new.instructions != old.instructions:
            self._queue_instructions(new.instructions)
        await self.send(SessionUpdated(event_id=self._event_id(), session=new.describe()))

    def _apply_vad(self) -> None:
        vad = self.settings.vad
        self._turns = None if vad is None else TurnDetector(vad, self._input_rate)

    def _queue_instructions(self, text: str) -> None:
        if text == self._sent_instructions:
            return
        if not self._takes_instructions:
            self.log.warning(
                "session %s: the pipeline's entry stage takes no instructions; ignored",
                self.settings.id,
            )
            return
        assert self._input is not None
        self._sent_instructions = text
        self._input.put(Op("instructions", text=text))

    # -- input -----------------------------------------------------------------------------

    async def _append(self, event: InputAudioBufferAppend) -> None:
        limits = self.state.settings
        samples = decode_audio(
            event.audio, self.settings.input_format, max_bytes=limits.max_append_bytes
        )
        assert self._input is not None
        held = self._buffered + self._input.queued_samples + samples.numel()
        if held > limits.max_input_buffer_s * self._input_rate:
            raise RequestError(
                f"the input buffer would hold more than {limits.max_input_buffer_s:g}s of "
                "audio (max_input_buffer_s); commit or clear it",
                realtime_code="input_audio_buffer_full",
            )
        if self._turns is None:
            self._forward(samples)
            return
        for action in self._turns.feed(samples):
            match action:
                case Forward(samples=piece):
                    self._forward(piece)
                case Started(audio_start_ms=start_ms):
                    self._pending_item = _new_id("item")
                    await self.send(
                        InputAudioBufferSpeechStarted(
                            event_id=self._event_id(),
                            audio_start_ms=start_ms,
                            item_id=self._pending_item,
                        )
                    )
                    vad = self.settings.vad
                    if self.active is not None and vad is not None and vad.interrupt_response:
                        await self._cancel(self.active, "turn_detected")
                case Stopped(audio_end_ms=end_ms):
                    item = self._pending_item or _new_id("item")
                    self._pending_item = item
                    await self.send(
                        InputAudioBufferSpeechStopped(
                            event_id=self._event_id(), audio_end_ms=end_ms, item_id=item
                        )
                    )
                    if self._buffered:
                        await self._commit(None)
                        vad = self.settings.vad
                        if vad is not None and vad.create_response and self.active is None:
                            await self._start_response(None, None)

    def _forward(self, samples: torch.Tensor) -> None:
        assert self._input is not None
        if samples.numel():
            self._buffered += samples.numel()
            self._input.put(Op("audio", samples=samples))

    async def _commit(self, event_id: str | None) -> None:
        if not self._buffered:
            raise RequestError(
                "the input audio buffer is empty: append audio before committing",
                realtime_code="input_audio_buffer_commit_empty",
            )
        assert self._input is not None
        item_id = self._pending_item or _new_id("item")
        self._pending_item = None
        self._buffered = 0
        self._input.put(Op("commit", event_id=event_id))
        previous, self._last_item = self._last_item, item_id
        item = ConversationItem(
            id=item_id,
            role="user",
            status="completed",
            content=[ItemContent(type="input_audio", transcript=None)],
        )
        await self._send_all(
            [
                InputAudioBufferCommitted(
                    event_id=self._event_id(), item_id=item_id, previous_item_id=previous
                ),
                ConversationItemAdded(
                    event_id=self._event_id(), item=item, previous_item_id=previous
                ),
                ConversationItemDone(
                    event_id=self._event_id(), item=item, previous_item_id=previous
                ),
            ]
        )

    def _clear(self) -> None:
        assert self._input is not None
        self._buffered = 0
        self._pending_item = None
        if self._turns is not None:
            self._turns.clear()
        self._input.put(Op("clear"))

    async def _create_item(self, event: ConversationItemCreate) -> None:
        item = event.item
        if item.type != "message":
            raise RequestError(f"items of type {item.type!r} are not supported; send message items")
        texts = [p.text for p in item.content if p.type in ("input_text", "text") and p.text]
        audios = [p.audio for p in item.content if p.type == "input_audio" and p.audio]
        if item.role == "system":
            if audios or not texts:
                raise RequestError("a system item holds input_text content only")
            self.settings = replace(self.settings, instructions="\n".join(texts))
            self._queue_instructions(self.settings.instructions)
        elif item.role == "user":
            if self._buffered:
                raise RequestError(
                    "the input audio buffer holds uncommitted audio; commit or clear it "
                    "before adding an item"
                )
            if not texts and not audios:
                raise RequestError("a user item needs input_text or input_audio content")
            decoded = [
                decode_audio(
                    a, self.settings.input_format, max_bytes=self.state.settings.max_append_bytes
                )
                for a in audios
            ]
            assert self._input is not None
            for text in texts:
                self._input.put(Op("text", event_id=event.event_id, text=text))
            for samples in decoded:
                self._input.put(Op("audio", event_id=event.event_id, samples=samples))
            self._input.put(Op("commit", event_id=event.event_id))
        else:
            raise RequestError(
                f"items with role {item.role!r} cannot be added: the pipeline generates "
                "assistant turns itself; add user or system items"
            )
        item_id = item.id or _new_id("item")
        previous, self._last_item = self._last_item, item_id
        content = [
            ItemContent(type=p.type, text=p.text, transcript=p.transcript) for p in item.content
        ]
        added = ConversationItem(
            id=item_id,
            role="system" if item.role == "system" else "user",
            status="completed",
            content=content,
        )
        await self._send_all(
            [
                ConversationItemAdded(
                    event_id=self._event_id(), item=added, previous_item_id=previous
                ),
                ConversationItemDone(
                    event_id=self._event_id(), item=added, previous_item_id=previous
                ),
            ]
        )

    async def _truncate(self, event: ConversationItemTruncate) -> None:
        reply = self._last_reply
        if reply is None or reply.item_id != event.item_id:
            raise RequestError(
                f"item {event.item_id!r} is not the last assistant item; only it can be truncated",
                realtime_code="item_truncate_invalid_item_id",
            )
        if self.active is not None:
            raise RequestError("a response is in flight; cancel it before truncating")
        if event.audio_end_ms < 0 or event.audio_end_ms > reply.audio_ms + 1:
            raise RequestError(
                f"audio_end_ms must be in [0, {reply.audio_ms:.0f}] (the item's audio), "
                f"got {event.audio_end_ms}",
                realtime_code="invalid_value",
            )
        assert self._input is not None
        self._input.put(Op("truncate", event_id=event.event_id, audio_ms=event.audio_end_ms))
        await self.send(
            ConversationItemTruncated(
                event_id=self._event_id(),
                item_id=event.item_id,
                content_index=event.content_index,
                audio_end_ms=event.audio_end_ms,
            )
        )

    # -- responses ---------------------------------------------------------------------------

    async def _create_response(self, event: ResponseCreate) -> None:
        if self.active is not None:
            raise RequestError(
                f"response {self.active.id} is in flight; cancel it or wait for its response.done",
                realtime_code="conversation_already_has_active_response",
            )
        await self._start_response(event, event.event_id)

    async def _start_response(self, event: ResponseCreate | None, event_id: str | None) -> None:
        params = event.response if event is not None else None
        settings = self.settings.for_response(params)
        if settings.instructions != self._sent_instructions:
            self._queue_instructions(settings.instructions)
        if self._buffered:
            await self._commit(None)
        stream = ResponseStream(
            _new_id("resp"),
            _new_id("item"),
            settings,
            source_rate=self._source_rate,
            event_id=self._event_id,
            conversation_id=self._conversation_id,
            metadata=params.metadata if params is not None else None,
        )
        self.active = self._last_reply = stream
        self._responses[stream.id] = stream
        self._last_item = stream.item_id
        assert self._input is not None
        self._input.put(Op("respond", event_id=event_id, stream=stream))
        self.log.info("session %s response %s created", self.settings.id, stream.id)
        await self._send_all(stream.opening())

    async def _cancel_response(self, event: ResponseCancel) -> None:
        active = self.active
        if active is None or (event.response_id and event.response_id != active.id):
            raise RequestError(
                "no response is in flight"
                if active is None
                else f"response {event.response_id!r} is not in flight ({active.id} is)",
                realtime_code="response_cancel_not_active",
            )
        await self._cancel(active, "client_cancelled")

    async def _cancel(self, stream: ResponseStream, reason: CancelReason) -> None:
        if stream.cancel_reason is not None:
            return
        stream.cancel_reason = reason  # its late deltas are dropped from now on
        self.log.info("session %s response %s cancelled (%s)", self.settings.id, stream.id, reason)
        if stream.response is not None:
            await stream.response.cancel()
        # Not started yet: the input stream finishes it when it reaches it.

    async def _input_refused(self, error: OmniError, op: Op) -> None:
        if op.kind == "respond" and op.stream is not None:
            code, message = (
                _described(error)
                if isinstance(error, InvalidRequestError)
                else (error.code, str(error))
            )
            await self._finish(
                op.stream, None, ErrorDetail(type="server_error", code=code, message=message)
            )
            return
        if isinstance(error, InvalidRequestError):
            await self.client_error(*_described(error), op.event_id)
        else:
            await self.client_error(error.code, str(error), op.event_id)

    async def _finish(
        self, stream: ResponseStream, done: PipelineResponseDone | None, error: ErrorDetail | None
    ) -> None:
        await self._send_all(stream.done(done, error))
        self.state.metrics.response_done(
            "cancelled" if stream.cancel_reason else (done.status if done else "failed"),
            done.metrics.ttft_ms if done else None,
            done.metrics.ttfa_ms if done else None,
        )
        self._responses.pop(stream.id, None)
        if self.active is stream:
            self.active = None
        self.state.response_ended.set()

    # -- the event pump ----------------------------------------------------------------------

    async def _pump(self) -> None:
        assert self.session is not None
        async for event in self.session:
            await self._on_event(event)
            if isinstance(event, TERMINAL):
                return

    async def _on_event(self, event: Event) -> None:
        match event:
            case TextDelta(response=rid, text=text):
                stream = self._responses.get(rid)
                if stream is not None:
                    await self._send_all(stream.on_text(text))
            case AudioDelta(response=rid, audio=audio):
                stream = self._responses.get(rid)
                if stream is not None:
                    await self._send_all(stream.on_audio(audio))
            case PipelineResponseDone(response=rid):
                stream = self._responses.get(rid)
                if stream is not None:
                    await self._finish(stream, event, None)
            case SessionError(code=code, message=message):
                await self._session_ended(code, message)
            case Aborted(reason=reason):
                await self._session_ended("aborted", reason)
            case Done():
                await self._session_ended("internal", "the session finished")

    async def _session_ended(self, code: str, message: str) -> None:
        """The session ended: what was in flight failed with it; the client is told."""
        detail = ErrorDetail(type="server_error", code=code, message=message)
        for stream in list(self._responses.values()):
            await self._finish(stream, None, detail)
        if not self._closing:
            await self.fail(code, f"the session ended: {message}", close_code=_CLOSE_INTERNAL)


def _described(error: InvalidRequestError) -> tuple[str, str]:
    """The Realtime ``error.code`` and message of a refused client event."""
    if isinstance(error, RequestError):
        return error.realtime_code, str(error)
    if isinstance(error, AudioPayloadError):
        return "invalid_audio", str(error)
    return error.code, str(error)
