"""``Replies``: a realtime session's responses — created, streamed, cancelled, done.

One response is in flight at a time (``active``); each is a :class:`ResponseStream` that
turns the pipeline's events into the Realtime API's. The event pump hands every session
event to :meth:`Replies.on_event`; a cancel (``response.cancel`` or barge-in) marks the
stream first, then cancels it on every stage (from that call on the session hands out
none of its deltas).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_actors.errors import InvalidRequestError, OmniError
from omni_actors.protocols.events import (
    Aborted,
    AudioDelta,
    Done,
    Event,
    SessionError,
    TextDelta,
)
from omni_actors.protocols.events import ResponseDone as PipelineResponseDone
from omni_actors.protocols.realtime_client import ResponseCancel, ResponseCreate
from omni_actors.protocols.realtime_server import ErrorDetail
from omni_actors.server.ids import new_id
from omni_actors.server.input_stream import Op
from omni_actors.server.request_error import RequestError, described
from omni_actors.server.response_stream import CancelReason, ResponseStream

if TYPE_CHECKING:
    from omni_actors.server.realtime import RealtimeConnection

__all__ = ["Replies"]

_CLOSE_INTERNAL = 1011


class Replies:
    """The responses of one realtime session (see the module docstring).

    Attributes:
        active: the response in flight, if any.
        last: the last response started: its item is the one a truncate may cut.
        streams: responses not done yet, by id.
    """

    def __init__(self, conn: RealtimeConnection) -> None:
        self.conn = conn
        self.active: ResponseStream | None = None
        self.last: ResponseStream | None = None
        self.streams: dict[str, ResponseStream] = {}

    async def create(self, event: ResponseCreate) -> None:
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
        await self.start(event, event.event_id)

    async def start(self, event: ResponseCreate | None, event_id: str | None) -> None:
        """Start a response (from ``response.create``, or from server VAD with no event):
        commit the buffer, queue it on the input stream, send its opening events."""
        params = event.response if event is not None else None
        settings = self.conn.settings.for_response(params)
        if settings.instructions != self.conn.sent_instructions:
            self.conn.queue_instructions(settings.instructions)
        if self.conn.input_buffer.buffered:
            await self.conn.input_buffer.commit(None)
        stream = ResponseStream(
            new_id("resp"),
            new_id("item"),
            settings,
            source_rate=self.conn.source_rate,
            event_id=lambda: new_id("event"),
            conversation_id=self.conn.conversation_id,
            metadata=params.metadata if params is not None else None,
        )
        self.active = self.last = stream
        self.streams[stream.id] = stream
        self.conn.last_item = stream.item_id
        assert self.conn.input is not None
        self.conn.input.put(Op("respond", event_id=event_id, stream=stream))
        self.conn.log.info("session %s response %s created", self.conn.settings.id, stream.id)
        await self.conn.send_all(stream.opening())

    async def cancel_requested(self, event: ResponseCancel) -> None:
        """``response.cancel``.

        Raises:
            RequestError: no response (or not the one named) is in flight.
        """
        active = self.active
        if active is None or (event.response_id and event.response_id != active.id):
            raise RequestError(
                "no response is in flight"
                if active is None
                else f"response {event.response_id!r} is not in flight ({active.id} is)",
                realtime_code="response_cancel_not_active",
            )
        await self.cancel(active, "client_cancelled")

    async def cancel(self, stream: ResponseStream, reason: CancelReason) -> None:
        """Cancel ``stream`` for ``reason``: stop it on every stage (no delta follows)."""
        if stream.cancel_reason is not None:
            return
        stream.cancel_reason = reason
        self.conn.log.info(
            "session %s response %s cancelled (%s)", self.conn.settings.id, stream.id, reason
        )
        if stream.response is not None:
            await stream.response.cancel()
        # Not started yet: the input stream finishes it when it reaches it.

    async def refused(self, error: OmniError, op: Op) -> None:
        """The session refused a queued operation: a response fails; else an ``error``."""
        if op.kind == "respond" and op.stream is not None:
            code, message = (
                described(error)
                if isinstance(error, InvalidRequestError)
                else (error.code, str(error))
            )
            await self.finish(
                op.stream, None, ErrorDetail(type="server_error", code=code, message=message)
            )
            return
        if isinstance(error, InvalidRequestError):
            await self.conn.client_error(*described(error), op.event_id)
        else:
            await self.conn.client_error(error.code, str(error), op.event_id)

    async def finish(
        self, stream: ResponseStream, done: PipelineResponseDone | None, error: ErrorDetail | None
    ) -> None:
        """Send ``stream``'s closing events (from ``done``, or a failure with ``error``)."""
        await self.conn.send_all(stream.done(done, error))
        self.conn.state.metrics.response_done(
            "cancelled" if stream.cancel_reason else (done.status if done else "failed"),
            done.metrics.ttft_ms if done else None,
            done.metrics.ttfa_ms if done else None,
        )
        self.streams.pop(stream.id, None)
        if self.active is stream:
            self.active = None
        self.conn.state.response_ended.set()

    async def on_event(self, event: Event) -> None:
        """One event of the session, from the event pump."""
        match event:
            case TextDelta(response=rid, text=text):
                stream = self.streams.get(rid)
                if stream is not None:
                    await self.conn.send_all(stream.on_text(text))
            case AudioDelta(response=rid, audio=audio):
                stream = self.streams.get(rid)
                if stream is not None:
                    await self.conn.send_all(stream.on_audio(audio))
            case PipelineResponseDone(response=rid):
                stream = self.streams.get(rid)
                if stream is not None:
                    await self.finish(stream, event, None)
            case SessionError(code=code, message=message):
                await self._session_ended(code, message)
            case Aborted(reason=reason):
                await self._session_ended("aborted", reason)
            case Done():
                await self._session_ended("internal", "the session finished")

    async def _session_ended(self, code: str, message: str) -> None:
        """The session ended: what was in flight failed with it; the client is told."""
        detail = ErrorDetail(type="server_error", code=code, message=message)
        for stream in list(self.streams.values()):
            await self.finish(stream, None, detail)
        if not self.conn.closing:
            await self.conn.fail(code, f"the session ended: {message}", close_code=_CLOSE_INTERNAL)
