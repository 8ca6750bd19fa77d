"""Ephemeral keys: ``POST /v1/realtime/client_secrets`` and the keys it hands out.

A browser must not hold the server's API key. The app's own backend, which holds it,
asks for a client secret (``ek_…``) bound to a session config and gives that to the
page; the page opens ``/v1/realtime`` with it (as the bearer token or the
``openai-insecure-api-key.`` subprotocol) until it expires, and its session starts from
the bound config. As OpenAI's, a secret may open several sessions until it expires, and
a session it opened outlives it.

The secrets live in this process's memory
(:class:`~omni_actors.server.ephemeral_keys.ClientSecrets`).
"""

from __future__ import annotations

import math

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from omni_actors.protocols.realtime_client import ClientSecretCreate, SessionConfig
from omni_actors.protocols.realtime_server import ClientSecretCreated
from omni_actors.server.auth import key_matches, offered_keys
from omni_actors.server.ephemeral_keys import DEFAULT_SECONDS, MAX_SECONDS, MIN_SECONDS
from omni_actors.server.http_error import error_response
from omni_actors.server.realtime import new_session_settings
from omni_actors.server.request_error import RequestError
from omni_actors.server.state import server_state

__all__ = ["create_client_secret"]

_decoder = msgspec.json.Decoder(ClientSecretCreate)
_encoder = msgspec.json.Encoder()


async def create_client_secret(request: Request) -> Response:
    """``POST /v1/realtime/client_secrets``: a key bound to the body's session config.

    It takes the server's API key (an ephemeral key cannot make another); the config is
    checked as a ``session.update`` of a new session would be, so a bad one is refused
    here, naming its ``param``, not when the browser connects.
    """
    state = server_state(request)
    if not key_matches(state.settings, offered_keys(request.headers, ())):
        return error_response(
            "missing or wrong API key: send the server's key as 'Authorization: Bearer "
            "KEY' (an ephemeral key cannot create another)",
            401,
            "invalid_api_key",
        )
    body = await request.body()
    try:
        asked = _decoder.decode(body or b"{}")
    except msgspec.DecodeError as exc:
        return error_response(f"invalid request body: {exc}", 400, "invalid_request_error")
    try:
        seconds = _seconds(asked)
        config = asked.session or SessionConfig()
        if config.type not in (None, "realtime"):
            raise RequestError(
                f"session type {config.type!r} is not served: this server opens "
                '"realtime" sessions only',
                realtime_code="invalid_value",
                param="session.type",
            )
        settings = await new_session_settings(state, config)
    except RequestError as exc:
        return error_response(str(exc), 400, exc.realtime_code, exc.param)
    secret = state.client_secrets.issue(config, seconds)
    created = ClientSecretCreated(
        value=secret.value,
        expires_at=math.floor(secret.expires_at),
        session=settings.describe(),
    )
    return Response(_encoder.encode(created), media_type="application/json")


def _seconds(asked: ClientSecretCreate) -> int:
    expires = asked.expires_after
    if expires is None:
        return DEFAULT_SECONDS
    if expires.anchor != "created_at":
        raise RequestError(
            f'expires_after.anchor must be "created_at", got {expires.anchor!r}',
            realtime_code="invalid_value",
            param="expires_after.anchor",
        )
    if not MIN_SECONDS <= expires.seconds <= MAX_SECONDS:
        raise RequestError(
            f"expires_after.seconds must be in [{MIN_SECONDS}, {MAX_SECONDS}], got "
            f"{expires.seconds}",
            realtime_code="invalid_value",
            param="expires_after.seconds",
        )
    return expires.seconds
