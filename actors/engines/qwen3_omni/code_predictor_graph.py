"""The talker's code predictor replayed from CUDA graphs.

A frame's residual codes take one small forward per codebook group, each a few dozen
tiny kernels: on a GPU the frame is bound by kernel launches (``bench cuda`` measured
4.96 ms eager against 0.40 ms replayed from one graph on an H100, bit for bit the same
codes). Its shapes depend only on the batch size, and nothing in it reads the device
from the host, so the whole frame is captured once per batch size and replayed
(:class:`~omni_actors.actors.engines.qwen3_omni.graphs.ShapeGraphs`: each batch size's
graph is checked against the eager frame's codes and carry at capture, else that batch
size stays eager and says so in the log).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from omni_actors.actors.engines.qwen3_omni import stepping
from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs

__all__ = ["GraphedCodePredictor"]


class GraphedCodePredictor:
    """``code_predictor_frame(talker, hidden, code0)``, replayed from a graph per batch
    size where the graph is exact. Call it on the thread that computes on the GPU.

    Args:
        talker: the HF talker, on a CUDA device.
        capture: how graphs are captured (see :class:`ShapeGraphs`).
    """

    def __init__(self, talker: Any, *, capture: Capture | None = None) -> None:
        self._talker = talker
        self._frame = functools.partial(stepping.code_predictor_frame, talker)
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

    def __call__(
        self, hidden: torch.Tensor, code0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes [B, groups], carry [B, 1, Ht])`` for ``hidden`` [B, 1, Ht], ``code0``
        [B, 1]."""
        codes, carry = self._graphs(hidden.shape[0], self._frame, hidden, code0)
        return codes, carry
