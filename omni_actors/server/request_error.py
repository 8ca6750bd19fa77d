"""``RequestError``: a client event the server cannot act on, with the Realtime API's
error ``code`` and the offending ``param``."""

from __future__ import annotations

from omni_actors.errors import InvalidRequestError

__all__ = ["RequestError", "described"]


class RequestError(InvalidRequestError):
    """A client event the server cannot act on; nothing changed.

    Attributes:
        realtime_code: the ``error.code`` the client gets (OpenAI's code where it has
            one, e.g. ``input_audio_buffer_commit_empty``).
        param: the offending field, if one.
    """

    def __init__(
        self, message: str, *, realtime_code: str = "invalid_request", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.realtime_code = realtime_code
        self.param = param


def described(error: InvalidRequestError) -> tuple[str, str]:
    """The Realtime ``error.code`` and message of a refused client event."""
    from omni_actors.server.audio_format import AudioPayloadError

    if isinstance(error, RequestError):
        return error.realtime_code, str(error)
    if isinstance(error, AudioPayloadError):
        return "invalid_audio", str(error)
    return error.code, str(error)
