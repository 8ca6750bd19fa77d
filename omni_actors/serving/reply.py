"""``Reply``: what a session's actor has of one response (one segment) until it is done."""

from __future__ import annotations

from omni_actors.protocols.error_code import ErrorCode
from omni_actors.protocols.events import Event, ResponseStatus
from omni_actors.protocols.stage import StageMetrics

__all__ = ["Reply"]


class Reply:
    """What the session has of one segment's reply: its reports, latencies and the events
    held until the segments before it are done."""

    __slots__ = (
        "audio_samples",
        "code",
        "done_at",
        "error_type",
        "finished",
        "first_audio",
        "first_text",
        "held",
        "last_audio",
        "message",
        "reports",
        "response",
        "stage",
        "status",
    )

    def __init__(self, response: str) -> None:
        self.response = response
        self.status: ResponseStatus = "completed"
        self.code: ErrorCode | None = None  # with status "failed"
        self.message = ""
        self.stage = ""
        self.error_type = ""
        self.first_text: float | None = None
        self.first_audio: float | None = None
        self.last_audio: float | None = None
        self.audio_samples = 0
        self.reports: dict[str, StageMetrics] = {}
        self.finished = False  # the session's last segment
        self.done_at: float | None = None  # every stage has reported it
        self.held: list[tuple[Event, str]] = []  # with their sources (see _emit)
