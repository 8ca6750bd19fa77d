"""The talker's code predictor replayed from CUDA graphs.

A frame's residual codes take one small forward per codebook group, each a few dozen
tiny kernels: on a GPU the frame is bound by kernel launches (``bench cuda`` measured
4.96 ms eager against 0.40 ms replayed from one graph on an H100, bit for bit the same
codes). Its shapes depend only on the batch size, and nothing in it reads the device
from the host, so the whole frame is captured once per batch size and replayed.

Each batch size's graph is checked when it is captured: on the capture's inputs, its
replay must give the eager frame's codes and carry bit for bit, else that batch size
stays eager (and says so in the log).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from omni_actors.actors.engines.qwen3_omni import stepping

__all__ = ["GraphedCodePredictor"]

log = logging.getLogger(__name__)

_WARMUP = 3  # eager runs on a side stream before capture, as CUDA graphs want


class _Graph:
    """One batch size's captured frame: static inputs in, static outputs out."""

    def __init__(self, talker: Any, hidden: torch.Tensor, code0: torch.Tensor) -> None:
        self.hidden = hidden.clone()
        self.code0 = code0.clone()
        side = torch.cuda.Stream(hidden.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(hidden.device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUP):
                stepping.code_predictor_frame(talker, self.hidden, self.code0)
        torch.cuda.current_stream(hidden.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the stage's other threads keep using the device meanwhile (its
        # transfers query events and pointers), which a global capture would forbid.
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.codes, self.carry = stepping.code_predictor_frame(talker, self.hidden, self.code0)

    def __call__(
        self, hidden: torch.Tensor, code0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.hidden.copy_(hidden)
        self.code0.copy_(code0)
        self.graph.replay()
        # The next replay overwrites the static outputs: each frame gets its own.
        return self.codes.clone(), self.carry.clone()


class GraphedCodePredictor:
    """``code_predictor_frame(talker, hidden, code0)``, replayed from a graph per batch
    size where the graph is exact. Call it on the thread that computes on the GPU.

    Args:
        talker: the HF talker, on a CUDA device.
    """

    def __init__(self, talker: Any) -> None:
        self._talker = talker
        self._graphs: dict[int, _Graph | None] = {}  # None: that batch size stays eager

    def warm(self, batch: int = 1) -> None:
        """Capture ``batch``'s graph now (on zeros), so no frame waits for it later."""
        width = int(self._talker.config.text_config.hidden_size)
        weight = next(self._talker.parameters())
        # In the talker's dtype: a float32 hidden state would promote the code
        # predictor's inputs past a bf16 checkpoint's weights.
        hidden = torch.zeros(batch, 1, width, device=weight.device, dtype=weight.dtype)
        if batch not in self._graphs:
            code0 = torch.zeros(batch, 1, dtype=torch.long, device=weight.device)
            self._graphs[batch] = self._capture(hidden, code0)

    @property
    def graphed(self) -> list[int]:
        """Batch sizes replayed from a graph."""
        return sorted(b for b, g in self._graphs.items() if g is not None)

    def __call__(
        self, hidden: torch.Tensor, code0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes [B, groups], carry [B, 1, Ht])`` for ``hidden`` [B, 1, Ht], ``code0``
        [B, 1]."""
        batch = hidden.shape[0]
        if batch not in self._graphs:
            self._graphs[batch] = self._capture(hidden, code0)
        graph = self._graphs[batch]
        if graph is None:
            return stepping.code_predictor_frame(self._talker, hidden, code0)
        return graph(hidden, code0)

    def _capture(self, hidden: torch.Tensor, code0: torch.Tensor) -> _Graph | None:
        eager = stepping.code_predictor_frame(self._talker, hidden, code0)
        try:
            graph = _Graph(self._talker, hidden, code0)
        except RuntimeError as exc:  # an op that cannot be captured: stay eager
            log.warning("code predictor, batch %d: not captured (%s); eager", hidden.shape[0], exc)
            return None
        replayed = graph(hidden, code0)
        if not all(torch.equal(a, b) for a, b in zip(eager, replayed, strict=True)):
            log.warning(
                "code predictor, batch %d: the graph differs from eager; eager", len(hidden)
            )
            return None
        return graph
