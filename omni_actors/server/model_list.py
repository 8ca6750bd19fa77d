"""``GET /v1/models`` and ``GET /v1/models/{id}``: the served model, as OpenAI lists
models (``protocols/openai_models.py``).

The server serves one model, under ``serve --served-model-name`` or else the
pipeline's name; its ``created`` is when the server started. Like every ``/v1`` route,
both need the API key when one is set.

One rule for model names, as vLLM's: a request naming another model (chat completions'
``model``, the realtime URL's ``?model=`` or ``session.model``, ``/v1/models/{id}``) is
refused with :func:`unknown_model`'s message, code ``model_not_found`` (HTTP 404);
a request naming none gets the served model.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from omni_actors.protocols.openai_models import Model, ModelList
from omni_actors.server.auth import authorized
from omni_actors.server.http_error import error_response
from omni_actors.server.state import ServerState, server_state

__all__ = [
    "MODEL_NOT_FOUND",
    "OWNED_BY",
    "list_models",
    "retrieve_model",
    "served_model",
    "served_name",
    "unknown_model",
]

OWNED_BY = "omni-actors"
MODEL_NOT_FOUND = "model_not_found"
"""The error code of a request naming a model the server does not serve (HTTP 404)."""

_encoder = msgspec.json.Encoder()


def served_name(state: ServerState) -> str:
    """The name of the model a server serves."""
    return state.settings.model or state.pipeline.spec.name


def unknown_model(wanted: str | None, served: str) -> str | None:
    """Why a request naming the model ``wanted`` is refused by a server serving
    ``served``; None when it names that model, or none."""
    if not wanted or wanted == served:
        return None
    return (
        f"the model {wanted!r} does not exist: this server serves {served!r} "
        "(name it, or leave the model out)"
    )


def served_model(state: ServerState) -> Model:
    """The model a server serves."""
    return Model(id=served_name(state), created=int(state.started_at), owned_by=OWNED_BY)


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
    refusal = unknown_model(request.path_params["model"], model.id)
    if refusal is not None:
        return error_response(refusal, 404, MODEL_NOT_FOUND, "model")
    return Response(_encoder.encode(model), media_type="application/json")
