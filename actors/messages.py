"""Control messages a session sends to the stages on its path.

They carry actor refs (where to send outputs), which is why they live here rather than
in ``omni_actors.protocols`` (that package imports nothing of the runtime). They are
msgspec structs all the same, so they cross process boundaries like any message.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from omni_actors._ref import ActorRef
from omni_actors.signals import ControlMessage

__all__ = ["Abort", "Deadlines", "Inspect", "Prewarm", "StageState", "Target"]


class Deadlines(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds a stage may wait for a session's input before the session fails.

    Attributes:
        first_chunk_s: for the first chunk of a segment of a one-shot session.
        inter_chunk_s: between two chunks of a segment.
        idle_s: for the first chunk of a segment of a resumable session (its caller
            decides when to speak).
        total_s: the session's whole life on this stage.
    """

    first_chunk_s: float
    inter_chunk_s: float
    idle_s: float
    total_s: float


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """Where a stage sends a session's outputs: one downstream stage.

    Attributes:
        stage: the receiver's name (used for metrics and messages).
        ref: the receiver.
        mode: ``stream`` (each output as it is produced) or ``full`` (one payload, the
            outputs merged by ``accumulate``, when the segment ends).
        fields: which output fields travel on this edge.
        window: ``(initial_frames, frames, left_context)`` when the edge windows codec
            frames through a ``ChunkPolicy`` (stream edges with one tensor field).
        accumulate: the receiver's per-field rules, for ``full`` edges.
    """

    stage: str
    ref: ActorRef[Any]
    mode: Literal["stream", "full"]
    fields: tuple[str, ...]
    window: tuple[int, int, int] | None = None
    accumulate: dict[str, Literal["concat", "replace"]] = {}


class Prewarm(msgspec.Struct, tag="prewarm", frozen=True, kw_only=True):
    """Allocate ``session``'s state on a stage and start waiting for its input.

    Attributes:
        session: the session id.
        owner: the session's owner: it receives output chunks for the caller and every
            ``StageReport``.
        sources: the streams this stage reads for the session (upstream stage names, or
            ``input`` for the entry stage); a segment ends when all of them end it.
        targets: downstream stages on the session's path (others are skipped).
        emit: output fields the owner receives (``text``, ``audio``).
        resumable: the input comes in segments (deadline between segments: ``idle_s``).
        deadlines: how long each wait may last.
    """

    session: str
    owner: ActorRef[Any]
    sources: tuple[str, ...]
    targets: tuple[Target, ...] = ()
    emit: tuple[str, ...] = ()
    resumable: bool = False
    deadlines: Deadlines


class Abort(msgspec.Struct, ControlMessage, tag="abort", frozen=True):
    """Stop ``session`` now and free its state; served before queued chunks."""

    session: str
    reason: str = ""


class Inspect(msgspec.Struct, tag="inspect", frozen=True):
    """Ask a stage what it holds (leak checks, health)."""


class StageState(msgspec.Struct, frozen=True, kw_only=True):
    """A stage's answer to :class:`Inspect`."""

    stage: str
    sessions: list[str]
