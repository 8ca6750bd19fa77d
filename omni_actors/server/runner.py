"""``run_server``: a pipeline and the realtime server on it, as one owned resource.

::

    async with run_server(ServerSettings(preset="tiny-omni", port=0)) as server:
        log.info("serving at %s", server.url)  # the demo page; websocket: server.ws_url
        await stop.wait()
    # drained, sessions closed, workers stopped

Leaving the block shuts down gracefully: new sessions are refused, the responses in
flight get ``settings.grace_s`` to finish, then every open session gets a final
``error`` event (``server_shutting_down``) and a close frame, uvicorn stops, and the
pipeline stops its stages and workers. The listening socket is bound before the block
is entered, so a client may connect at once (port 0 picks a free port).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import uvicorn

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.server.app import create_app
from omni_actors.server.settings import ServerSettings
from omni_actors.server.state import ServerState

__all__ = ["RunningServer", "run_server"]

log = logging.getLogger(__name__)

_UVICORN_GRACE_S = 5


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the owner of the server decides what a
    signal means (``omni-actors serve`` drains first; a test never gets signals)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RunningServer:
    """A server started by :func:`run_server`.

    Attributes:
        url: the server's base URL (the demo page), one this machine can open: on
            every interface (``0.0.0.0``, ``::``) it names the loopback address.
        ws_url: the realtime websocket's URL.
        state: what its routes share (pipeline, metrics, connections).
        network_url: on every interface, the URL by this machine's name, for a browser
            elsewhere; None when the server listens on one address.
    """

    url: str
    ws_url: str
    state: ServerState
    _server: _Server
    _task: asyncio.Task[None]
    network_url: str | None = None

    async def shutdown(self) -> None:
        """Drain and stop (see the module docstring); safe to call twice."""
        state = self.state
        if not state.draining:
            state.draining = True
            # uvicorn makes its listeners in its task's first steps: a block left before
            # then has none to close, and the should_exit below stops uvicorn as soon as
            # it has started (it closes them itself), with no main loop run.
            for listener in getattr(self._server, "servers", ()):
                listener.close()  # stop accepting
            await self._drain(state.settings.grace_s)
            for connection in list(state.connections):
                await connection.shut_down(
                    "the server is shutting down; reconnect to another instance"
                )
            await state.calls.close()  # their connections are closed: their calls end
        self._server.should_exit = True
        await self._task

    async def _drain(self, grace_s: float) -> None:
        """Wait, ``grace_s`` at most, for the responses in flight to finish."""
        state = self.state
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                while state.responding():
                    state.response_ended.clear()
                    await state.response_ended.wait()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _openable(host: str) -> str:
    """``host``, or the loopback address when it means every interface: a browser
    cannot open ``http://0.0.0.0:8000``."""
    if ipaddress.ip_address(host).is_unspecified:
        return "::1" if ":" in host else "127.0.0.1"
    return host


def _urls(host: str, port: int, tls: bool) -> tuple[str, str]:
    """The base URL and the realtime websocket's URL of ``host:port``."""
    where = f"[{host}]" if ":" in host else host
    http, ws = ("https", "wss") if tls else ("http", "ws")
    return f"{http}://{where}:{port}", f"{ws}://{where}:{port}/v1/realtime"


@contextlib.asynccontextmanager
async def run_server(
    settings: ServerSettings, *, pipeline: PipelineSpec | str | None = None
) -> AsyncIterator[RunningServer]:
    """Start the pipeline (``pipeline`` or ``settings.preset``) and serve it.

    Raises:
        OSError: the address is taken (nothing was started).
        VoiceMapError: ``settings.voice_map`` names a voice the model does not have.
    """
    sock = _listen(settings.host, settings.port)
    try:
        spec = pipeline if pipeline is not None else settings.preset
        async with OmniPipeline(spec, max_sessions=settings.max_sessions) as omni:
            app = create_app(settings, omni)
            # Learnt before the first client: a voice map naming a speaker the model
            # lacks fails the start rather than a session.
            await app.state.server.voices()
            config = uvicorn.Config(
                app,
                loop="none",  # the caller's loop (uvloop under ``omni-actors serve``)
                http="httptools",
                ws="websockets-sansio",
                ws_max_size=2 * settings.max_message_bytes,  # above it: the connection drops
                lifespan="off",  # ``omni`` is owned here
                log_config=None,
                timeout_graceful_shutdown=_UVICORN_GRACE_S,
                ssl_certfile=settings.ssl_certfile,
                ssl_keyfile=settings.ssl_keyfile,
            )
            server = _Server(config)
            task = asyncio.create_task(server.serve(sockets=[sock]), name="uvicorn")
            host, port = sock.getsockname()[:2]
            tls = settings.ssl_certfile is not None
            url, ws_url = _urls(_openable(host), port, tls)
            everywhere = ipaddress.ip_address(host).is_unspecified
            running = RunningServer(
                url=url,
                ws_url=ws_url,
                state=app.state.server,
                _server=server,
                _task=task,
                network_url=_urls(socket.gethostname(), port, tls)[0] if everywhere else None,
            )
            try:
                yield running
            finally:
                await running.shutdown()
    finally:
        sock.close()
