"""A stand-in for CUDA graph capture, for the step loops' graph paths on a CPU."""

from __future__ import annotations

from typing import Any

import torch


class StandIn:
    """A graph: ``replay`` recomputes the captured step into its outputs, in place."""

    def __init__(self, fn: Any, inputs: tuple[torch.Tensor, ...]) -> None:
        self.fn, self.inputs, self.outputs, self.replays = fn, inputs, fn(*inputs), 0

    def replay(self) -> None:
        self.replays += 1
        for static, new in zip(self.outputs, self.fn(*self.inputs), strict=True):
            static.copy_(new)


class Captures:
    """The capture a model's graphs are given: records each graph."""

    def __init__(self) -> None:
        self.graphs: list[StandIn] = []

    def __call__(self, fn: Any, inputs: tuple[torch.Tensor, ...]) -> StandIn:
        self.graphs.append(StandIn(fn, inputs))
        return self.graphs[-1]

    @property
    def replays(self) -> int:
        return sum(graph.replays for graph in self.graphs)
