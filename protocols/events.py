"""What a caller receives from a session: text and audio deltas, then a terminal event.

Every session's event stream ends with exactly one terminal event — :class:`Done`,
:class:`SessionError` or :class:`Aborted` — so a caller never waits on a stream that
cannot end. In a resumable session (a conversation) each response's events end with
exactly one :class:`ResponseDone`, whose ``status`` says whether the reply
``completed``, was ``cancelled`` (barge-in) or ``failed`` (the session stays open).
Every event's ``session`` is the id the caller chose (or was given) for the session; the
deltas and ``ResponseDone`` also name their ``response``.

A session that transcribes what its caller says (``Session.transcribe``) also gets, per
user turn, :class:`TranscriptDelta` pieces as the transcriber writes them (none from
one that does not stream), then :class:`TranscriptDone` or :class:`TranscriptFailed`,
each naming the turn by the ``item`` its caller gave it on ``commit``. They come from
the transcriber, a stage off the reply's path, as soon as each turn is transcribed:
they belong to no response (``Response.events()`` yields them as they come, among the
reply's), and a transcript that fails fails alone.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import torch

from omni_actors.protocols.error_code import ErrorCode
from omni_actors.protocols.stage import StageMetrics

__all__ = [
    "AudioPacing",
    "Aborted",
    "AudioDelta",
    "Done",
    "ErrorCode",
    "Event",
    "ResponseDone",
    "ResponseStatus",
    "SessionError",
    "SessionMetrics",
    "TextDelta",
    "TERMINAL",
    "TRANSCRIPT_EVENTS",
    "TranscriptDelta",
    "TranscriptDone",
    "TranscriptFailed",
]


class AudioPacing(msgspec.Struct, frozen=True, kw_only=True):
    """How smoothly a response's audio reached the session's owner, as a player that
    holds back ``jitter_buffer_ms`` and then plays at real time would have heard it (see
    ``omni_actors.audio.playout``).

    Attributes:
        deltas: audio deltas received.
        gap_max_ms: the longest wait between two deltas (None with fewer than two).
        jitter_buffer_ms: the player's buffer the underruns are counted against.
        underruns: times that player's buffer ran dry before the audio ended.
        stall_ms: the silence those underruns cost.
    """

    deltas: int = 0
    gap_max_ms: float | None = None
    jitter_buffer_ms: float = 0.0
    underruns: int = 0
    stall_ms: float = 0.0


class SessionMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """Latency and throughput of one segment (or of the whole of a one-shot session).

    Times are measured from the request (``generate``) or from the end of the segment's
    input (resumable sessions) to the event reaching the session's owner.

    Attributes:
        ttft_ms: to the first text delta (None: no text).
        ttfa_ms: to the first audio delta (None: no audio).
        e2e_ms: to the end of the segment.
        audio_s: seconds of audio produced.
        rtf: real-time factor, wall time from the start to the last audio delta divided
            by ``audio_s`` (below 1: faster than real time; None without audio).
        stages: per-stage metrics (queue wait, compute, chunks and bytes per hop).
        pacing: how smoothly the audio came (None without audio).
    """

    ttft_ms: float | None = None
    ttfa_ms: float | None = None
    e2e_ms: float = 0.0
    audio_s: float = 0.0
    rtf: float | None = None
    stages: dict[str, StageMetrics] = {}
    pacing: AudioPacing | None = None


class TextDelta(msgspec.Struct, tag="text_delta", frozen=True, kw_only=True):
    """New text from the pipeline's text stage (``response``: "" in a one-shot session)."""

    session: str
    text: str
    response: str = ""


class AudioDelta(msgspec.Struct, tag="audio_delta", frozen=True, kw_only=True):
    """New mono audio samples (float, ``sample_rate`` Hz) from the audio stage."""

    session: str
    audio: torch.Tensor
    sample_rate: int
    response: str = ""


class TranscriptDelta(msgspec.Struct, tag="transcript_delta", frozen=True, kw_only=True):
    """The next piece of the user turn ``item``'s transcript, as the transcriber wrote it
    (the ``TranscriptDone`` that follows holds the whole)."""

    session: str
    item: str
    delta: str


class TranscriptDone(msgspec.Struct, tag="transcript_done", frozen=True, kw_only=True):
    """The transcript of the user turn ``item`` (what the caller said in it)."""

    session: str
    item: str
    transcript: str


class TranscriptFailed(msgspec.Struct, tag="transcript_failed", frozen=True, kw_only=True):
    """The user turn ``item`` could not be transcribed; ``item`` "" means every turn not
    transcribed yet (the transcriber failed; the session and its replies go on).

    Attributes:
        code: what kind of failure (as in ``SessionError``).
        message: what happened.
    """

    session: str
    item: str
    code: ErrorCode
    message: str


ResponseStatus = Literal["completed", "cancelled", "failed"]
"""How a response ended: it ran to its end, the caller cancelled it, or it failed."""


class ResponseDone(msgspec.Struct, tag="response_done", frozen=True, kw_only=True):
    """Every stage is done with response ``response`` (segment ``segment``); the session
    stays open whatever the ``status``.

    Attributes:
        status: see :data:`ResponseStatus`.
        metrics: latencies and per-stage figures of the response.
        code: with ``failed``, what kind of failure (as in ``SessionError``).
        message: with ``failed``, what happened.
        stage: with ``failed``, the stage where it happened.
    """

    session: str
    response: str
    segment: int
    status: ResponseStatus = "completed"
    metrics: SessionMetrics
    code: ErrorCode | None = None
    message: str = ""
    stage: str = ""


class Done(msgspec.Struct, tag="done", frozen=True, kw_only=True):
    """Terminal: the session finished on every stage."""

    session: str
    metrics: SessionMetrics


class SessionError(msgspec.Struct, tag="error", frozen=True, kw_only=True):
    """Terminal: the session failed; every stage has been told to free its state.

    Attributes:
        code: what kind of failure (``timeout`` for any expired deadline); see
            :data:`~omni_actors.protocols.error_code.ErrorCode`.
        message: what happened and, where it helps, what to change.
        stage: the stage where it happened ("" when not stage-specific).
        error_type: the qualified exception type, for programs.
    """

    session: str
    code: ErrorCode
    message: str
    stage: str = ""
    error_type: str = ""


class Aborted(msgspec.Struct, tag="aborted", frozen=True, kw_only=True):
    """Terminal: the session was aborted (caller cancel, explicit abort, disconnect)."""

    session: str
    reason: str


Event = (
    TextDelta
    | AudioDelta
    | ResponseDone
    | TranscriptDelta
    | TranscriptDone
    | TranscriptFailed
    | Done
    | SessionError
    | Aborted
)
"""Every event a session yields."""

TERMINAL = (Done, SessionError, Aborted)
"""The event types that end a session's stream."""

TRANSCRIPT_EVENTS = (TranscriptDelta, TranscriptDone, TranscriptFailed)
"""The event types of the caller's turns' transcripts: they belong to no response."""
