"""``SegmentMetrics``: what one stage session measures of the segment it serves.

Counted on the per-chunk path, so they are plain attributes of one object; the stage
session's report turns them into a :class:`~omni_actors.protocols.stage.StageMetrics`
at the segment's end and starts counting afresh.
"""

from __future__ import annotations

import time

import torch

from omni_actors.protocols.stage import FinishReason, HopMetrics, StageMetrics

__all__ = ["SegmentMetrics"]


class SegmentMetrics:
    """One segment's counts (see ``StageMetrics`` for what each means).

    Attributes:
        queue_wait: seconds input chunks waited between their sender and the engine.
        queue_wait_max: the longest that one of them waited.
        compute: seconds the engine spent producing outputs, its waits for input out.
        blocked: seconds the engine waited for input (subtracted from ``compute``).
        chunks_in, duplicates, outputs, queued_max: as ``StageMetrics``.
        first_output_at: ``time.time()`` of the first output, None before it.
        last_output: ``time.monotonic()`` of the last output (the wall time is made
            only for the report: one clock read per output), None before it.
        tokens: rows of ``token_ids`` outputs (``StageMetrics.completion_tokens``).
        prompt_tokens: as ``StageMetrics``, once the engine told it.
        limit: the most token ids the reply could have, from an engine that tells
            (``StageMetrics.finish_reason``), else None.
    """

    __slots__ = (
        "blocked",
        "chunks_in",
        "compute",
        "duplicates",
        "first_output_at",
        "last_output",
        "limit",
        "outputs",
        "prompt_tokens",
        "queue_wait",
        "queue_wait_max",
        "queued_max",
        "tokens",
    )

    def __init__(self, queued: int = 0) -> None:
        self.queue_wait = 0.0
        self.queue_wait_max = 0.0
        self.compute = 0.0
        self.blocked = 0.0
        self.chunks_in = 0
        self.duplicates = 0
        self.outputs = 0
        self.first_output_at: float | None = None
        self.last_output: float | None = None
        self.queued_max = queued  # chunks already queued count for the new segment
        self.tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.limit: int | None = None

    def took(self, waited: float) -> None:
        """The engine took an input chunk that waited ``waited`` seconds since it was sent."""
        self.queue_wait += waited
        if waited > self.queue_wait_max:
            self.queue_wait_max = waited
        self.chunks_in += 1

    def output(self, now: float, token_ids: object = None) -> None:
        """The engine yielded an output at ``time.monotonic()`` reading ``now``, with
        ``token_ids`` (its field of that name, if any)."""
        self.outputs += 1
        if isinstance(token_ids, torch.Tensor):
            self.tokens = (self.tokens or 0) + (token_ids.shape[0] if token_ids.dim() else 1)
        self.last_output = now
        if self.first_output_at is None:
            self.first_output_at = _wall(now)

    def report(self, hops: dict[str, HopMetrics]) -> StageMetrics:
        """The segment's metrics, with what was sent to each receiver."""
        last = self.last_output
        return StageMetrics(
            queue_wait_ms=self.queue_wait * 1e3,
            queue_wait_max_ms=self.queue_wait_max * 1e3,
            compute_ms=self.compute * 1e3,
            chunks_in=self.chunks_in,
            duplicates=self.duplicates,
            outputs=self.outputs,
            hops=hops,
            queued_max=self.queued_max,
            first_output_at=self.first_output_at,
            last_output_at=None if last is None else _wall(last),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.tokens,
            finish_reason=self._finish_reason(),
        )

    def _finish_reason(self) -> FinishReason | None:
        """``length`` when the reply yielded as many token ids as it could have."""
        if self.limit is None or self.tokens is None:
            return None
        return "length" if self.tokens >= self.limit else "stop"


def _wall(monotonic: float) -> float:
    """The ``time.time()`` of a ``time.monotonic()`` reading."""
    return time.time() - (time.monotonic() - monotonic)
