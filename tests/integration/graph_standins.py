"""Stand-ins for CUDA graph capture and for a ``torch.compile`` backend, for the step
loops' graph and compile paths on a CPU."""

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


class Differs(Captures):
    """Graphs whose replays are a little off eager's: each is dropped at its check."""

    def __call__(self, fn: Any, inputs: tuple[torch.Tensor, ...]) -> Any:
        graph = super().__call__(fn, inputs)
        replay = graph.replay

        def off() -> None:
            replay()
            for output in graph.outputs:
                if output.is_floating_point():  # codes stay codes
                    output.add_(1e-3)

        graph.replay = off  # type: ignore[method-assign]
        return graph


class Backend:
    """A ``torch.compile`` backend: ``aot_eager`` (no compiler needed, the same ops), noting
    the input shapes of each graph it compiles; ``fail`` raises as a compile that fails."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.graphs: list[tuple[Any, ...]] = []
        self.runs = 0
        """Calls of the graphs it compiled."""

    def __call__(self, graph: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        if self.fail:
            raise RuntimeError("no C++ compiler found")
        self.graphs.append(tuple(str(x.shape) if torch.is_tensor(x) else str(x) for x in inputs))
        compiled = torch._dynamo.lookup_backend("aot_eager")(graph, inputs)

        def run(*args: Any) -> Any:
            self.runs += 1
            return compiled(*args)

        return run
