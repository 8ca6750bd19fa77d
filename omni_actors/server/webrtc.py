"""``POST /v1/realtime/calls``: a realtime session over WebRTC, as OpenAI's browser path.

The caller posts its SDP offer (``application/sdp``, or ``multipart/form-data`` with
``sdp`` and a ``session`` config as JSON) with the bearer key the websocket takes, the
server's or an ephemeral one from ``/v1/realtime/client_secrets``; the answer is the SDP
answer, ``201 Created``, its ``Location`` naming the call. The session then runs over
the call (``webrtc_call.py``): events on the ``oai-events`` data channel, audio on the
tracks. ``POST /v1/realtime/calls/{call_id}/hangup`` ends it.

WebRTC needs aiortc (the ``webrtc`` extra), imported when a call comes: without it the
route answers 501, saying what to install.
"""

from __future__ import annotations

import logging

import msgspec
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response

from omni_actors.protocols.realtime_client import SessionConfig
from omni_actors.server.auth import key_matches, offered_keys, origin_allowed
from omni_actors.server.ephemeral_keys import ClientSecret
from omni_actors.server.http_error import error_response
from omni_actors.server.ids import new_id
from omni_actors.server.model_list import MODEL_NOT_FOUND, served_name, unknown_model
from omni_actors.server.realtime import new_session_settings
from omni_actors.server.request_error import RequestError
from omni_actors.server.state import ServerState, server_state

__all__ = ["CALLS_PATH", "create_call", "hang_up_call"]

log = logging.getLogger(__name__)

CALLS_PATH = "/v1/realtime/calls"
_MAX_OFFER_BYTES = 64 * 1024  # a browser's offer is a few kilobytes
_config_decoder = msgspec.json.Decoder(SessionConfig)


async def create_call(request: Request) -> Response:
    """``POST /v1/realtime/calls``: answer an SDP offer, start the call's session."""
    state = server_state(request)
    refusal = _refused(request, state)
    if refusal is not None:
        return refusal
    secret = _secret(request, state)
    wanted = unknown_model(request.query_params.get("model"), served_name(state))
    if wanted is not None:
        return error_response(wanted, 404, MODEL_NOT_FOUND, "model")
    try:
        offer, config = await _offer(request)
        configs = [c for c in (None if secret is None else secret.session, config) if c]
        for each in configs:  # refused here, naming its param, not once the call runs
            await new_session_settings(state, each)
    except RequestError as exc:
        return error_response(str(exc), 400, exc.realtime_code, exc.param)
    try:
        from omni_actors.server import webrtc_call
    except ImportError as exc:
        return error_response(
            f"WebRTC is not installed on this server ({exc}): install it with "
            "`pip install 'omni-actors[webrtc]'` (aiortc), or use the websocket "
            "/v1/realtime",
            501,
            "webrtc_not_installed",
        )
    if not state.admit():
        reason = "the server is shutting down" if state.draining else "the server is full"
        return error_response(
            f"{reason} ({state.max_sessions} sessions at most: max_sessions); retry later",
            503,
            "busy",
        )
    call_id = new_id("rtc")
    try:
        call, answer = await webrtc_call.answer_call(call_id, state, offer, configs)
    except Exception as exc:  # aiortc refuses a malformed offer with many types
        state.release()
        log.info("call %s: offer refused: %r", call_id, exc)
        return error_response(
            f"the SDP offer cannot be answered ({exc}): send the offer of an "
            "RTCPeerConnection with an audio track and a data channel",
            400,
            "invalid_offer",
            "sdp",
        )

    async def run() -> None:
        try:
            await call.run()
        finally:
            state.release()

    state.calls.start(call_id, run())
    log.info("call %s answered", call_id)
    return Response(
        answer,
        status_code=201,
        media_type="application/sdp",
        headers={"Location": f"{CALLS_PATH}/{call_id}"},
    )


async def hang_up_call(request: Request) -> Response:
    """``POST /v1/realtime/calls/{call_id}/hangup``: end the call, its session with it."""
    state = server_state(request)
    refusal = _refused(request, state)
    if refusal is not None:
        return refusal
    call_id = request.path_params["call_id"]
    if not await state.calls.hang_up(call_id):
        return error_response(
            f"no call {call_id!r} is live (it ended, or never was)", 404, "call_not_found"
        )
    return Response(status_code=200)


def _refused(request: Request, state: ServerState) -> Response | None:
    """The refusal of a caller from an origin not allowed, or without a key."""
    headers = request.headers
    if not origin_allowed(state.settings, headers):
        return error_response(
            f"the origin {headers.get('origin')!r} may not open a call: add it to the "
            "server's allowed origins (--allowed-origin)",
            403,
            "origin_not_allowed",
        )
    if _secret(request, state) is None and not key_matches(
        state.settings, offered_keys(headers, ())
    ):
        return error_response(
            "missing, wrong or expired API key: send it as 'Authorization: Bearer KEY', "
            "the server's key or a live ephemeral key from POST /v1/realtime/client_secrets",
            401,
            "invalid_api_key",
        )
    return None


def _secret(request: Request, state: ServerState) -> ClientSecret | None:
    keys = offered_keys(request.headers, ())
    return next((found for key in keys if (found := state.client_secrets.find(key))), None)


async def _offer(request: Request) -> tuple[str, SessionConfig | None]:
    """The offer's SDP and the call's own session config (None: none given).

    Raises:
        RequestError: no offer, or a ``session`` that is not a session config.
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    config: SessionConfig | None = None
    if kind == "multipart/form-data":
        async with request.form(max_files=2, max_fields=4) as form:
            sdp = await _text(form.get("sdp"))
            session = await _text(form.get("session"))
        if session:
            try:
                config = _config_decoder.decode(session)
            except msgspec.DecodeError as exc:
                raise RequestError(
                    f"session is not a session config: {exc}", param="session"
                ) from None
    elif kind in ("application/sdp", "text/plain", ""):
        sdp = (await request.body()).decode("utf-8", "replace")
    else:
        raise RequestError(
            f"the offer comes as application/sdp, or multipart/form-data with sdp and "
            f"session parts, not {kind!r}",
            param="sdp",
        )
    if not sdp.strip() or len(sdp) > _MAX_OFFER_BYTES:
        raise RequestError(
            f"the body needs the SDP offer (at most {_MAX_OFFER_BYTES} bytes)", param="sdp"
        )
    return sdp, config


async def _text(part: str | UploadFile | None) -> str:
    """A form part's text (a browser may send the offer as a file part)."""
    if part is None:
        return ""
    if isinstance(part, str):
        return part
    return (await part.read(_MAX_OFFER_BYTES + 1)).decode("utf-8", "replace")
