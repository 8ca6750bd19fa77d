"""``ServerState``: what every route of one server shares."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.voices import VoiceMap
from omni_actors.server.calls import Calls
from omni_actors.server.ephemeral_keys import ClientSecrets
from omni_actors.server.metrics import ServerMetrics
from omni_actors.server.settings import ServerSettings

if TYPE_CHECKING:
    from omni_actors.server.realtime import RealtimeConnection

__all__ = ["ServerState", "server_state"]


@dataclass(eq=False)
class ServerState:
    """The pipeline, settings, metrics and live connections of one server.

    Attributes:
        active: sessions held now (realtime connections and chat requests); at
            :attr:`max_sessions` one more is refused as ``busy``.
        draining: the server is shutting down: new sessions are refused.
    """

    settings: ServerSettings
    pipeline: OmniPipeline
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    connections: set[RealtimeConnection] = field(default_factory=set)
    client_secrets: ClientSecrets = field(default_factory=ClientSecrets)
    """The ephemeral keys handed out and alive (``POST /v1/realtime/client_secrets``)."""
    calls: Calls = field(default_factory=Calls)
    """The WebRTC calls answered and not ended (``POST /v1/realtime/calls``)."""
    active: int = 0
    chats: int = 0
    """Chat completions being answered (each holds one of the ``active`` slots)."""
    draining: bool = False
    response_ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set each time a response ends (a draining server waits on it)."""
    started_at: float = field(default_factory=time.time)
    """When the server started serving (Unix seconds: the model's ``created``)."""

    def responding(self) -> bool:
        """True while a chat completion or a realtime connection's response is in flight."""
        return self.chats > 0 or any(c.active is not None for c in self.connections)

    def __post_init__(self) -> None:
        # One map for the library and the server: the pipeline's, with the server's names.
        self.pipeline.voice_map.update(self.settings.voice_map)

    async def voices(self) -> VoiceMap:
        """The voice names clients may send: the pipeline's map
        (``OmniPipeline.voices``), the configured names included.

        Raises:
            VoiceMapError: the configured map names a voice the model does not have.
        """
        return await self.pipeline.voices()

    @property
    def max_sessions(self) -> int:
        """Sessions served at once: ``settings.max_sessions``, or fewer where the
        pipeline's stages hold fewer (``OmniPipeline.max_sessions``)."""
        return min(self.settings.max_sessions, self.pipeline.max_sessions)

    def admit(self) -> bool:
        """Take a session slot; False when the server is full or draining."""
        if self.draining or self.active >= self.max_sessions:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        """Give a session slot back."""
        self.active -= 1


def server_state(connection: HTTPConnection) -> ServerState:
    """The state of the server a request (or websocket) came to."""
    state = connection.app.state.server
    assert isinstance(state, ServerState)
    return state
