"""``RealtimeConnection``: one websocket on ``/v1/realtime``, one conversation session.

The connection owns three tasks and waits for the first to end: the reader (client
events, acted on at once and never blocked by the pipeline), the input stream (queued
input handed to the session in order, ``input_stream.py``) and the event pump (the
session's events turned into Realtime events). The reader hands input events to the
:class:`InputBuffer` (``input_buffer.py``: appended audio, server VAD, items, truncate)
and response events to :class:`Replies` (``replies.py``: one
:class:`ResponseStream` per response); the event pump hands session events to
:class:`Replies` too. When one ends —
the client went away, the session ended, the server is shutting down — the others are
cancelled and the session is aborted on every stage: a connection leaves nothing
behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_actors.errors import InvalidRequestError
from omni_actors.pipeline.session import Session
from omni_actors.protocols.events import (
    TERMINAL,
)
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
    ErrorDetail,
    ErrorEvent,
    InputAudioBufferCleared,
    ServerEvent,
    SessionCreated,
    SessionUpdated,
)
from omni_actors.server.audio_format import format_rate
from omni_actors.server.ids import new_id
from omni_actors.server.input_buffer import InputBuffer
from omni_actors.server.input_stream import INSTRUCTIONS_FIELD, InputStream, Op
from omni_actors.server.replies import Replies
from omni_actors.server.request_error import described
from omni_actors.server.session_config import SessionSettings, SettingError
from omni_actors.server.state import ServerState

__all__ = ["RealtimeConnection"]

log = logging.getLogger(__name__)

_SEND_TIMEOUT_S = 30.0  # a client that reads nothing for this long is dropped
_CLOSE_GOING_AWAY = 1001
_CLOSE_INTERNAL = 1011
_CLOSE_TRY_LATER = 1013

_encoder = msgspec.json.Encoder()


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
            id=new_id("sess"), model=state.settings.model or spec.name, created_at=time.time()
        )
        self.log = logging.LoggerAdapter(log, {"session": self.settings.id})
        self.session: Session | None = None
        self.input: InputStream | None = None
        self.source_rate = spec.outputs.sample_rate
        self._takes_instructions = INSTRUCTIONS_FIELD in spec.entry_inputs()
        self.sent_instructions = ""
        self.last_item: str | None = None  # the conversation's last item
        self.input_buffer = InputBuffer(self)
        self.replies = Replies(self)
        self.conversation_id = new_id("conv")
        self.closing = False

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
            self.input = InputStream(session, self.input_rate, self.replies.refused)
            self.input_buffer.apply_vad()
            await self.send(
                SessionCreated(event_id=new_id("event"), session=self.settings.describe())
            )
            if self.settings.instructions:
                self.queue_instructions(self.settings.instructions)
            tasks = [
                asyncio.create_task(self._read(), name=f"realtime {self.settings.id} reader"),
                asyncio.create_task(self.input.run(), name=f"realtime {self.settings.id} input"),
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
                    await self.ws.close(_CLOSE_INTERNAL if not self.closing else _CLOSE_GOING_AWAY)
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
            await self.ws.close(close_code, reason=message[:120])

    # -- sending -----------------------------------------------------------------------

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
                    *described(exc), event.event_id, getattr(exc, "param", None)
                )

    async def _handle(self, event: ClientEvent) -> None:
        match event:
            case InputAudioBufferAppend():
                await self.input_buffer.append(event)
            case InputAudioBufferCommit():
                await self.input_buffer.commit(event.event_id)
            case InputAudioBufferClear():
                self.input_buffer.clear()
                await self.send(InputAudioBufferCleared(event_id=new_id("event")))
            case ResponseCreate():
                await self.replies.create(event)
            case ResponseCancel():
                await self.replies.cancel_requested(event)
            case SessionUpdate():
                await self._update(event)
            case ConversationItemCreate():
                await self.input_buffer.create_item(event)
            case ConversationItemTruncate():
                await self.input_buffer.truncate(event)

    # -- session settings ----------------------------------------------------------------

    async def _update(self, event: SessionUpdate) -> None:
        new = self.settings.updated(event.session)
        if new.input_format != self.settings.input_format and self.input_buffer.buffered:
            raise SettingError(
                "the input format cannot change while the input buffer holds audio; "
                "commit or clear it first",
                "session.audio.input.format",
            )
        old = self.settings
        self.settings = new
        if new.input_format != old.input_format and self.input is not None:
            self.input.rate = self.input_rate
        if new.vad != old.vad or new.input_format != old.input_format:
            self.input_buffer.apply_vad()
        if new.instructions != old.instructions:
            self.queue_instructions(new.instructions)
        await self.send(SessionUpdated(event_id=new_id("event"), session=new.describe()))

    def queue_instructions(self, text: str) -> None:
        """Send new instructions to the entry stage (if it takes them), in input order."""
        if text == self.sent_instructions:
            return
        if not self._takes_instructions:
            self.log.warning(
                "session %s: the pipeline's entry stage takes no instructions; ignored",
                self.settings.id,
            )
            return
        assert self.input is not None
        self.sent_instructions = text
        self.input.put(Op("instructions", text=text))

    # -- the event pump ----------------------------------------------------------------------

    async def _pump(self) -> None:
        assert self.session is not None
        async for event in self.session:
            await self.replies.on_event(event)
            if isinstance(event, TERMINAL):
                return
