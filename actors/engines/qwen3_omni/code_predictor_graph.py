"""The talker's code predictor replayed from CUDA graphs.

A frame's residual codes take one small forward per codebook group, each a few dozen
tiny kernels: on a GPU the frame is bound by kernel launches (``bench cuda`` measured
4.96 ms eager against 0.40 ms replayed from one graph on an H100, bit for bit the same
codes). Its shapes depend only on the batch size, and nothing in it reads the device
from the host, so the whole frame is captured once per batch size and replayed
(:class:`~omni_actors.actors.engines.qwen3_omni.graphs.ShapeGraphs`: each batch size's
graph is checked against the eager frame's codes and carry at capture, else that batch
size stays eager and says so in the log).

With ``buckets``, a batch runs as the smallest bucket that holds it, padded with copies
of its last row (the frame is row-wise): a handful of graphs, captured at load, serve
every batch, where one graph per exact size would be captured while sessions wait (a
capture takes about half a second at full size) and checked on live rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from omni_actors.actors.engines.qwen3_omni import stepping
from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs, bucket, pad_rows

__all__ = ["GraphedCodePredictor"]


class GraphedCodePredictor:
    """``code_predictor_frame(talker, hidden, code0)``, replayed from a graph per batch
    size where the graph is exact. Call it on the thread that computes on the GPU.

    Args:
        talker: the HF talker, on a CUDA device.
        buckets: the batch sizes graphs are captured for (a batch runs as the smallest
            that holds it); none: one graph per batch size.
        frame: the frame to replay (a compiled one), in place of ``code_predictor_frame``.
        capture: how graphs are captured (see :class:`ShapeGraphs`).
    """

    def __init__(
        self,
        talker: Any,
        *,
        buckets: Sequence[int] = (),
        frame: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
        | None = None,
        capture: Capture | None = None,
    ) -> None:
        self._talker = talker
        self._frame = frame or functools.partial(stepping.code_predictor_frame, talker)
        self._buckets = tuple(sorted(buckets))
        self._graphs: ShapeGraphs[int] = ShapeGraphs("code predictor, batch", capture=capture)

    def warm(self, batch: int = 1) -> None:
        """Capture ``batch``'s graph now (on zeros), so no frame waits for it later."""
        width = int(self._talker.config.text_config.hidden_size)
        weight = next(self._talker.parameters())
        # In the talker's dtype: a float32 hidden state would promote the code
        # predictor's inputs past a bf16 checkpoint's weights.
        hidden = torch.zeros(batch, 1, width, device=weight.device, dtype=weight.dtype)
        code0 = torch.zeros(batch, 1, dtype=torch.long, device=weight.device)
        self._graphs.capture(batch, self._frame, hidden, code0)

    @property
    def graphed(self) -> list[int]:
        """Batch sizes replayed from a graph."""
        return sorted(self._graphs.graphed)

    @property
    def eager_steps(self) -> int:
        """Frames run eager because their batch size's graph failed or differed."""
        return self._graphs.eager_steps

    def __call__(
        self, hidden: torch.Tensor, code0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes [B, groups], carry [B, 1, Ht])`` for ``hidden`` [B, 1, Ht], ``code0``
        [B, 1]."""
        count = hidden.shape[0]
        size = (bucket(count, self._buckets) if self._buckets else None) or count
        if size != count:
            hidden, code0 = pad_rows(hidden, size), pad_rows(code0, size)
        codes, carry = self._graphs(size, self._frame, hidden, code0)
        return codes[:count], carry[:count]
