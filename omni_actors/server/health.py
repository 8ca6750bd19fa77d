"""``/healthz`` and ``/readyz``: is the process alive, and can it serve a session now?

Liveness only says the process answers HTTP: an orchestrator (Kubernetes, a load
balancer) restarts a server that fails it. Readiness says whether to send it traffic:
every stage is running (none is being restarted after a crash) and the server is not
draining. A stage crash makes the server unready until its supervisor has restarted it,
without the process being restarted, which is the point of supervising the stages.
"""

from __future__ import annotations

import logging

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omni_actors.errors import OmniError
from omni_actors.protocols.control import PipelineHealth, StageHealth
from omni_actors.server.state import ServerState, server_state

__all__ = ["Readiness", "SessionCounts", "healthz", "pipeline_health", "readiness", "readyz"]

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0
"""How long a probe waits for the pipeline's answer: a probe must answer quickly, and a
pipeline that cannot answer in this time is not ready."""


class SessionCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Sessions held by the server.

    Attributes:
        realtime: open ``/v1/realtime`` connections.
        active: session slots taken (realtime connections and chat requests), of
            ``max_sessions``.
    """

    realtime: int
    active: int


class Readiness(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``/readyz``.

    Attributes:
        ready: every stage is running and the server is not draining (HTTP 200; else
            503).
        draining: the server is shutting down and refuses new sessions.
        stages: each stage actor's health, by name (empty if the pipeline did not
            answer).
        sessions: what the server holds.
    """

    ready: bool
    draining: bool
    stages: dict[str, StageHealth]
    sessions: SessionCounts


async def pipeline_health(state: ServerState) -> PipelineHealth | None:
    """The pipeline's health, or None if it did not answer (stopped, or stuck)."""
    try:
        return await state.pipeline.health(timeout=HEALTH_TIMEOUT_S)
    except (OmniError, RuntimeError) as exc:  # RuntimeError: the pipeline is closed
        log.warning("the pipeline did not report its health: %r", exc)
        return None


async def readiness(state: ServerState) -> Readiness:
    """What ``/readyz`` reports (see :class:`Readiness`)."""
    health = await pipeline_health(state)
    return Readiness(
        ready=health is not None and health.ready and not state.draining,
        draining=state.draining,
        stages={} if health is None else health.stages,
        sessions=SessionCounts(realtime=len(state.connections), active=state.active),
    )


async def healthz(request: Request) -> Response:
    """Liveness: the process serves requests."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Readiness: 200 when every stage runs and the server is not draining, else 503."""
    report = await readiness(server_state(request))
    return Response(
        msgspec.json.encode(report),
        status_code=200 if report.ready else 503,
        media_type="application/json",
    )
