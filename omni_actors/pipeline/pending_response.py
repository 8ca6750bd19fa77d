"""``PendingResponse``: what a session's actor has of one response until it is done.

A response is the caller-facing answer to one segment of the session's input, with the
id its caller gave it; the stages know it only as that segment (``Chunk.segment``).
"""

from __future__ import annotations

import time

from omni_actors.audio.playout import Playout
from omni_actors.protocols.error_code import ErrorCode
from omni_actors.protocols.events import (
    AudioDelta,
    AudioPacing,
    ResponseStatus,
    SessionMetrics,
    TextDelta,
)
from omni_actors.protocols.stage import Chunk, StageMetrics

__all__ = ["PendingResponse"]


class PendingResponse:
    """What the session has of one response: the stages' reports of its segment, its
    latencies and the events held until the responses before it are done.

    Args:
        response: the response's id (in its events; "" for a session's one reply).
    """

    __slots__ = (
        "audio_samples",
        "code",
        "done_at",
        "error_type",
        "finished",
        "first_audio",
        "first_text",
        "held",
        "kept_reply",
        "last_audio",
        "message",
        "playout",
        "reports",
        "response",
        "rolled_back",
        "stage",
        "status",
        "texts",
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
        self.playout = Playout()  # how a listener would have heard the audio as it came
        self.reports: dict[str, StageMetrics] = {}
        self.finished = False  # the session's last segment
        self.done_at: float | None = None  # every stage has reported it
        self.held: list[tuple[TextDelta | AudioDelta, str]] = []  # with their sources
        # What the conversation keeps of it, for its replay: the reply tokens the stage
        # that writes the replies generated, or that it (or the entry) failed the
        # response and went back to where it started.
        self.kept_reply: tuple[int, ...] | None = None
        self.rolled_back = False
        # Each text chunk that reached the caller, as (its stage, its number, its text):
        # what a truncation keeps of the reply's text (``heard``).
        self.texts: list[tuple[str, int, str]] = []

    def metrics(self, start: float | None, sample_rate: int, stages: list[str]) -> SessionMetrics:
        """The response's metrics, counted from ``start`` (when its input ended; the
        time it was done if unknown), with the reports of ``stages`` in that order."""
        end = self.done_at if self.done_at is not None else time.monotonic()
        since_start = end if start is None else start
        audio_s = self.audio_samples / sample_rate

        # An output that came before ``start`` (an entry engine answering a turn while it
        # still arrived) reached the caller when its response was asked for: at 0 ms.
        def since(t: float | None) -> float | None:
            return None if t is None else max(0.0, t - since_start) * 1e3

        rtf = None
        if audio_s > 0 and self.last_audio is not None:
            rtf = max(0.0, self.last_audio - since_start) / audio_s
        playout = self.playout
        pacing = None
        if playout.packets:
            gap = playout.gap_max_s
            pacing = AudioPacing(
                deltas=playout.packets,
                gap_max_ms=None if gap is None else gap * 1e3,
                jitter_buffer_ms=playout.buffer_s * 1e3,
                underruns=playout.underruns,
                stall_ms=playout.stall_s * 1e3,
            )
        return SessionMetrics(
            ttft_ms=since(self.first_text),
            ttfa_ms=since(self.first_audio),
            e2e_ms=(end - since_start) * 1e3,
            audio_s=audio_s,
            rtf=rtf,
            stages={name: self.reports[name] for name in stages if name in self.reports},
            pacing=pacing,
        )

    def deltas(
        self, chunk: Chunk, session: str, sample_rate: int
    ) -> tuple[TextDelta | None, AudioDelta | None]:
        """The caller's events for an output stage's ``chunk`` of this response's segment
        (its ``text`` and ``audio``, when not empty), counted in the response's latencies."""
        # Latencies count when the output reaches the session, held or not.
        now = time.monotonic()
        text_delta = audio_delta = None
        text = chunk.texts.get("text")
        if text is not None:
            self.texts.append((chunk.source, chunk.seq, text))
        if text:
            if self.first_text is None:
                self.first_text = now
            text_delta = TextDelta(session=session, text=text, response=self.response)
        audio = chunk.tensors.get("audio")
        if audio is not None and audio.numel():
            if self.first_audio is None:
                self.first_audio = now
            self.last_audio = now
            self.audio_samples += audio.numel()
            self.playout.add(now, audio.numel() / sample_rate)
            audio_delta = AudioDelta(
                session=session, audio=audio, sample_rate=sample_rate, response=self.response
            )
        return text_delta, audio_delta

    def heard(self, stage: str, kept: int) -> str:
        """The reply's text of ``stage``'s first ``kept`` outputs (one chunk each)."""
        pieces = [(seq, text) for source, seq, text in self.texts if source == stage]
        if not pieces:
            return ""
        first = pieces[0][0]
        return "".join(text for seq, text in pieces if seq - first < kept)

    def cut(self, code: ErrorCode, stage: str, message: str, now: float) -> None:
        """The session's streams broke at ``stage`` under this response: it is done,
        failed with ``code`` (unless cancelled), and its held events grant no credit."""
        if self.status == "completed":
            self.status, self.code = "failed", code
            self.message, self.stage = message, stage
            self.kept_reply = None  # a failed response is not part of the conversation
        self.held = [(event, "") for event, _ in self.held]
        self.done_at = now
