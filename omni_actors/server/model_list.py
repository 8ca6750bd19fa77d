"""``GET /v1/models`` and ``GET /v1/models/{id}``: the served model, as OpenAI lists
models (``protocols/openai_models.py``).

The server serves one model, under ``serve``'s model name or else the pipeline's; its
``created`` is when the server started. Like every ``/v1`` route, both need the API key
when one is set.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from omni_actors.protocols.openai_models import Model, ModelList
from omni_actors.server.auth import authorized
from omni_actors.server.http_error import error_response
from omni_actors.server.state import ServerState, server_state

__all__ = ["OWNED_BY", "list_models", "retrieve_model", "served_model"]

OWNED_BY = "omni-actors"

_encoder = msgspec.json.Encoder()


def served_model(state: ServerState) -> Model:
    """The model a server serves."""
    settings = state.settings
    return Model(
        id=settings.model or state.pipeline.spec.name,
        created=int(state.started_at),
        owned_by=OWNED_BY,
    )


def _refused(request: Request) -> Response | None:
    if authorized(server_state(request).settings, request.headers, ()):
        return None
    return error_response(
        "missing or wrong API key: send it as 'Authorization: Bearer KEY'", 401, "invalid_api_key"
    )


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: a list of the one served model."""
    refused = _refused(request)
    if refused is not None:
        return refused
    listed = ModelList(data=[served_model(server_state(request))])
    return Response(_encoder.encode(listed), media_type="application/json")


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{id}``: the served model, or a 404 for any other id."""
    refused = _refused(request)
    if refused is not None:
        return refused
    model = served_model(server_state(request))
    wanted = request.path_params["model"]
    if wanted != model.id:
        return error_response(
            f"the model {wanted!r} does not exist: this server serves {model.id!r}",
            404,
            "model_not_found",
            "model",
        )
    return Response(_encoder.encode(model), media_type="application/json")
