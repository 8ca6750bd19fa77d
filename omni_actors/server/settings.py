"""``ServerSettings``: what ``omni-actors serve`` is configured with, in one place.

Every limit has a default a voice agent can live with and a flag of the same name on
``omni-actors serve``; a limit that is hit is an ``error`` event naming the setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerSettings"]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The realtime server's settings.

    Attributes:
        preset: the pipeline (a preset name or a YAML path).
        host: the interface to listen on (loopback by default: put a reverse proxy
            with TLS in front to serve beyond this machine, or give the certificate
            below).
        ssl_certfile: serve https and wss with this PEM certificate (and
            ``ssl_keyfile``): a browser gives a page its microphone only on https or
            on localhost.
        ssl_keyfile: the certificate's private key (PEM).
        port: the TCP port (0: any free port, as tests use).
        api_key: when set, a client must present it (``Authorization: Bearer KEY``, or
            the ``openai-insecure-api-key.KEY`` websocket subprotocol that browsers use).
        allowed_origins: websocket ``Origin``s accepted besides the server's own (a
            browser page from elsewhere is refused at the handshake); ``*`` allows any.
        max_sessions: realtime sessions served at once; one more is refused with a
            ``busy`` error.
        max_message_bytes: the largest websocket message a client may send.
        max_append_bytes: the largest audio payload of one ``input_audio_buffer.append``
            (decoded bytes).
        max_input_buffer_s: seconds of audio a session may hold uncommitted, and buffered
            while the pipeline is busy; more is refused with an ``error`` event.
        idle_timeout_s: a session with no client event for this long is closed.
        grace_s: on SIGINT/SIGTERM, how long responses in flight may take to finish
            before the sessions are closed.
        model: the model name served (``--served-model-name``): reported in
            ``session.created``, chat completions and ``/v1/models``; a request naming
            another is refused. "": the pipeline's name.
        voice_map: voice names a client may send and the model speaker each one means
            (``alloy: ethan``), besides the default that maps every OpenAI voice name
            (``voices.py``); a name it maps to no speaker of the model fails the start.
    """

    preset: str = "tiny-omni"
    host: str = "127.0.0.1"
    port: int = 8000
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    max_sessions: int = 64
    max_message_bytes: int = 16 * 1024 * 1024
    max_append_bytes: int = 15 * 1024 * 1024
    max_input_buffer_s: float = 600.0
    idle_timeout_s: float = 600.0
    grace_s: float = 10.0
    model: str = ""
    voice_map: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_message_bytes", "max_append_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_input_buffer_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {self.grace_s}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("TLS needs both ssl_certfile and ssl_keyfile (a PEM each)")
        for name in ("ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name} {path}: no such file")
