"""A frame's residual codes replayed from CUDA graphs: the talker's code predictor, CSM's
depth decoder.

A frame's residual codes take one small forward per codebook, each a few dozen tiny
kernels: on a GPU the frame is bound by kernel launches (``bench cuda`` measured 4.96 ms
eager against 0.40 ms replayed from one graph on an H100 for the talker's code
predictor, bit for bit the same codes). Its shapes depend only on the batch size, and
nothing in it reads the device from the host, so the whole frame is captured once per
batch size and replayed
(:class:`~omni_actors.actors.engines.qwen3_omni.graphs.ShapeGraphs`: each batch size's
graph is checked against the eager frame's outputs at capture, else that batch size
stays eager and says so in the log).

With ``buckets``, a batch runs as the smallest bucket that holds it, padded with copies
of its last row (the frame is row-wise): a handful of graphs, captured at load, serve
every batch, where one graph per exact size would be captured while sessions wait (a
capture takes about half a second at full size) and checked on live rows; a batch past
the largest bucket runs eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from omni_actors.actors.engines.qwen3_omni import stepping
from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs, bucket, pad_rows

__all__ = ["CodeFrame", "GraphedCodePredictor"]

CodeFrame = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]
"""``frame(hidden, code0)`` -> a frame's outputs, each with one row per input row."""


class GraphedCodePredictor:
    """``frame(hidden, code0)``, replayed from a graph per batch size where the graph is
    exact. Call it on the thread that computes on the GPU.

    Args:
        frame: the row-wise frame: the backbone's last ``hidden`` states and their first
            codes in, its outputs (the frame's codes first) out.
        zeros: the inputs ``(hidden, code0)`` of a batch of that many rows, all zeros,
            on the frame's device and in its dtypes (what :meth:`warm` captures on).
        buckets: the batch sizes graphs are captured for (a batch runs as the smallest
            that holds it, a larger one eagerly); none: one graph per batch size.
        capture: how graphs are captured (see :class:`ShapeGraphs`).
        name: the frame, for the log.
    """

    def __init__(
        self,
        frame: CodeFrame,
        zeros: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
        *,
        buckets: Sequence[int] = (),
        capture: Capture | None = None,
        name: str = "code predictor",
    ) -> None:
        self._frame = frame
        self._zeros = zeros
        self._buckets = tuple(sorted(buckets))
        self._graphs: ShapeGraphs[int] = ShapeGraphs(f"{name}, batch", capture=capture)

    @classmethod
    def of_talker(
        cls,
        talker: Any,
        *,
        buckets: Sequence[int] = (),
        frame: CodeFrame | None = None,
        capture: Capture | None = None,
    ) -> GraphedCodePredictor:
        """The Qwen3-Omni talker's code predictor: ``code_predictor_frame(talker, hidden
        [B, 1, Ht], code0 [B, 1])`` -> ``(codes [B, groups], carry [B, 1, Ht])``, or
        ``frame`` (a compiled one) in its place."""
        width = int(talker.config.text_config.hidden_size)
        weight = next(talker.parameters())

        def zeros(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
            # In the talker's dtype: a float32 hidden state would promote the code
            # predictor's inputs past a bf16 checkpoint's weights.
            hidden = torch.zeros(batch, 1, width, device=weight.device, dtype=weight.dtype)
            return hidden, torch.zeros(batch, 1, dtype=torch.long, device=weight.device)

        return cls(
            frame or functools.partial(stepping.code_predictor_frame, talker),
            zeros,
            buckets=buckets,
            capture=capture,
        )

    def warm(self, batch: int = 1) -> None:
        """Capture ``batch``'s graph now (on zeros), so no frame waits for it later."""
        self._graphs.capture(batch, self._frame, *self._zeros(batch))

    @property
    def graphed(self) -> list[int]:
        """Batch sizes replayed from a graph."""
        return sorted(self._graphs.graphed)

    @property
    def eager_steps(self) -> int:
        """Frames run eager: past the largest bucket, or of a batch size whose graph
        failed or differed."""
        return self._graphs.eager_steps

    def __call__(self, hidden: torch.Tensor, code0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The frame's outputs for ``hidden`` and ``code0`` (one row each per frame)."""
        count = hidden.shape[0]
        size = bucket(count, self._buckets) if self._buckets else count
        if size is None:  # past the largest bucket: eager, no graph captured while serving
            return tuple(self._graphs.run_eager(self._frame, hidden, code0))
        if size != count:
            hidden, code0 = pad_rows(hidden, size), pad_rows(code0, size)
        outputs = self._graphs(size, self._frame, hidden, code0)
        return tuple(output[:count] for output in outputs)
