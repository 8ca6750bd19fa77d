"""The ASGI app: the routes of ``omni-actors serve``.

- ``/v1/realtime`` — the OpenAI Realtime websocket (``realtime.py``).
- ``POST /v1/realtime/calls`` — the same session over WebRTC, as OpenAI's browser path
  (``webrtc.py``; aiortc, the ``webrtc`` extra), and ``.../{call_id}/hangup``.
- ``POST /v1/realtime/client_secrets`` — an ephemeral key for a browser, bound to a
  session config (``client_secrets.py``).
- ``POST /v1/chat/completions`` — OpenAI's chat completions, text and audio output
  (``chat_completions.py``).
- ``GET /v1/models``, ``GET /v1/models/{id}`` — the served model (``model_list.py``).
- ``/healthz`` — liveness: the process answers; ``/readyz`` — readiness: every stage
  runs and the server is not draining (``health.py``).
- ``/metrics`` — Prometheus text (``metrics.py``).
- ``/`` and ``/static/…`` — the demo page.

:func:`create_app` serves a running :class:`OmniPipeline` (``runner.py`` owns one);
given none, the app starts its own in its lifespan, so ``uvicorn
omni_actors.server.app:app`` also works.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.server.auth import key_matches, offered_keys, origin_allowed, pick_subprotocol
from omni_actors.server.chat_completions import chat_completions
from omni_actors.server.client_secrets import create_client_secret
from omni_actors.server.health import healthz, pipeline_health, readyz
from omni_actors.server.http_error import error_response
from omni_actors.server.model_list import (
    MODEL_NOT_FOUND,
    list_models,
    retrieve_model,
    served_name,
    unknown_model,
)
from omni_actors.server.realtime import RealtimeConnection
from omni_actors.server.realtime_transport import WebSocketTransport
from omni_actors.server.settings import ServerSettings
from omni_actors.server.state import ServerState, server_state
from omni_actors.server.webrtc import CALLS_PATH, create_call, hang_up_call

__all__ = ["STATIC", "create_app"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
_POLICY_VIOLATION = 1008
_TRY_AGAIN_LATER = 1013


async def realtime(websocket: WebSocket) -> None:
    """``/v1/realtime``: check the handshake, then serve one session."""
    state = server_state(websocket)
    headers = websocket.headers
    offered = list(websocket.scope.get("subprotocols") or [])
    if not origin_allowed(state.settings, headers):
        log.warning("realtime: refused origin %s", headers.get("origin"))
        origin = headers.get("origin")
        await _deny(
            websocket,
            error_response(
                f"the origin {origin!r} may not open a session: add it to the server's "
                "allowed origins (--allowed-origin)",
                403,
                "origin_not_allowed",
            ),
        )
        return
    keys = offered_keys(headers, offered)
    # An ephemeral key opens the session with its config, until it expires; an expired
    # or unknown one is refused as a wrong key is.
    secret = next(
        (found for key in keys if (found := state.client_secrets.find(key)) is not None), None
    )
    if secret is None and not key_matches(state.settings, keys):
        log.warning("realtime: refused a client without the API key")
        await _deny(
            websocket,
            error_response(
                "missing, wrong or expired API key: send it as 'Authorization: Bearer KEY' "
                "(or, from a browser, as the subprotocol openai-insecure-api-key.KEY), "
                "with the server's key or a live ephemeral key from "
                "POST /v1/realtime/client_secrets",
                401,
                "invalid_api_key",
            ),
        )
        return
    refusal = unknown_model(websocket.query_params.get("model"), served_name(state))
    if refusal is not None:
        await _deny(websocket, error_response(refusal, 404, MODEL_NOT_FOUND, "model"))
        return
    await websocket.accept(subprotocol=pick_subprotocol(offered))
    connection = RealtimeConnection(
        WebSocketTransport(websocket),
        state,
        beta="realtime=v1" in headers.get("openai-beta", ""),
        configs=() if secret is None else (secret.session,),
    )
    if not state.admit():
        reason = "the server is shutting down" if state.draining else "the server is full"
        await connection.fail(
            "busy",
            f"{reason} ({state.max_sessions} sessions at most: max_sessions); retry later",
            close_code=_TRY_AGAIN_LATER,
        )
        return
    try:
        await connection.serve()
    finally:
        state.release()


async def _deny(websocket: WebSocket, response: Response) -> None:
    """Refuse a handshake with ``response`` (its status and OpenAI's error body) where
    the ASGI server can send one (uvicorn does); else with a bare HTTP 403."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:
        await websocket.close(_POLICY_VIOLATION)  # before accept: an HTTP 403


async def metrics(request: Request) -> Response:
    """Prometheus metrics; the per-stage gauges are read from the pipeline first."""
    state = server_state(request)
    health = await pipeline_health(state)
    if health is not None:
        state.metrics.stages_seen(health)
    state.metrics.transport_seen(state.pipeline.transport_counts())
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


async def index(request: Request) -> Response:
    """The demo page."""
    return FileResponse(STATIC / "index.html")


def create_app(settings: ServerSettings, pipeline: OmniPipeline | None = None) -> Starlette:
    """The server's ASGI app (see the module docstring).

    Args:
        settings: the server's settings.
        pipeline: a started pipeline to serve; if None, the app starts one from
            ``settings.preset`` in its lifespan and stops it at shutdown.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if pipeline is not None:  # its owner starts and stops it
            yield
            return
        async with OmniPipeline(settings.preset, max_sessions=settings.max_sessions) as own:
            app.state.server = ServerState(settings, own)
            await app.state.server.voices()
            try:
                yield
            finally:
                await app.state.server.calls.close()

    routes = [
        WebSocketRoute("/v1/realtime", realtime),
        Route(CALLS_PATH, create_call, methods=["POST"]),
        Route(CALLS_PATH + "/{call_id}/hangup", hang_up_call, methods=["POST"]),
        Route("/v1/realtime/client_secrets", create_client_secret, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models),
        Route("/v1/models/{model:path}", retrieve_model),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
        Route("/", index),
        Mount("/static", app=StaticFiles(directory=STATIC, check_dir=False), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    if pipeline is not None:
        app.state.server = ServerState(settings, pipeline)
    return app
