"""What a realtime session needs of the connection that carries its events.

One session implementation (:class:`~omni_actors.server.realtime.RealtimeConnection`)
serves two transports: the websocket on ``/v1/realtime`` (:class:`WebSocketTransport`)
and a WebRTC call's ``oai-events`` data channel (``webrtc_call.py``). A transport moves
the events' JSON text both ways and closes; a WebRTC call also carries the audio, on
its media tracks (:class:`CallAudio`), so its events carry none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

import torch
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

__all__ = ["CallAudio", "ClientGone", "EventTransport", "Playout", "WebSocketTransport"]

Playout = Literal["started", "stopped", "cleared"]
"""What became of a reply on a call's track: it began playing, played to its end, or was
cut (OpenAI's ``output_audio_buffer.*`` events)."""


class ClientGone(Exception):
    """The client left while an event was being sent to it."""


class EventTransport(Protocol):
    """The events' way to and from the client."""

    async def receive(self) -> str | bytes | None:
        """The client's next message (text is an event); None once the client left."""
        ...

    async def send(self, text: str) -> None:
        """Send one event's JSON text.

        Raises:
            ClientGone: the client left.
        """
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close the connection (a websocket close code; a no-op once closed)."""
        ...


class CallAudio(Protocol):
    """A call's audio: the caller's microphone in, the replies played out in real time.

    The player knows how much of each reply went out, so a barge-in or a cancel cuts
    the reply where the caller stopped hearing it.
    """

    async def listen(self, heard: Callable[[torch.Tensor, int], Awaitable[None]]) -> None:
        """Hand the caller's audio (int16 mono samples, and their rate) to ``heard``
        until the track ends (its owner cancels)."""
        ...

    def play(self, response_id: str, samples: torch.Tensor, rate: int) -> None:
        """Queue a piece of a reply's audio (float samples at ``rate``) behind the rest."""
        ...

    def end(self, response_id: str) -> None:
        """The reply's audio is all queued."""
        ...

    def playing(self, response_id: str) -> bool:
        """Whether some of the reply is queued or playing still."""
        ...

    async def playout(self) -> tuple[Playout, str]:
        """The next change of a reply's playout, and the reply's id."""
        ...

    def cut(self, response_id: str) -> float | None:
        """Stop playing the reply now: its milliseconds played, or None if none of it
        is queued or playing (it played to its end, or never began)."""
        ...


class WebSocketTransport:
    """The ``/v1/realtime`` websocket (accepted) as a session's transport."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket

    async def receive(self) -> str | bytes | None:
        """The next text or binary frame; None once the client closed."""
        try:
            message = await self.websocket.receive()
        except WebSocketDisconnect:
            return None
        if message["type"] == "websocket.disconnect":
            return None
        text: str | None = message.get("text")
        if text is not None:
            return text
        data: bytes = message.get("bytes") or b""
        return data

    async def send(self, text: str) -> None:
        """Send one text frame."""
        try:
            await self.websocket.send_text(text)
        except WebSocketDisconnect as exc:
            raise ClientGone(str(exc)) from exc

    async def close(self, code: int, reason: str) -> None:
        """Send a close frame, unless the connection is closed already."""
        if self.websocket.application_state == WebSocketState.CONNECTED:
            await self.websocket.close(code, reason=reason[:120])
