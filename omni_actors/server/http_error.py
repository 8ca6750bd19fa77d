"""OpenAI's error body on every HTTP refusal: ``{"error": {"message", "type", "code",
"param"}}``, the shape OpenAI's clients parse into their typed errors (a bare status
leaves an app with nothing to show)."""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from omni_actors.protocols.chat_completions import ErrorBody, ErrorDetail

__all__ = ["error_body", "error_response"]

_encoder = msgspec.json.Encoder()


def error_body(message: str, status: int, code: str, param: str | None = None) -> ErrorBody:
    """The body of a refusal: ``invalid_request_error`` for a 4xx, else ``server_error``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return ErrorBody(error=ErrorDetail(message=message, type=kind, param=param, code=code))


def error_response(message: str, status: int, code: str, param: str | None = None) -> Response:
    """A JSON response carrying :func:`error_body`."""
    return Response(
        _encoder.encode(error_body(message, status, code, param)),
        status_code=status,
        media_type="application/json",
    )
