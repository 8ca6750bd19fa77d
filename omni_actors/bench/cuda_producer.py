"""``bench cuda``'s producing stage: an MLP stack in a model thread of its own, its
steps eager or replayed from CUDA graphs, each step's output on its way out per mode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

from omni_actors.cuda import HostStaging, Transfer
from omni_actors.cuda.step_ready import mark_step

if TYPE_CHECKING:
    from omni_actors.bench.cuda import CudaBenchConfig

__all__ = ["Mode", "Producer", "Step", "dtype_of"]

Mode = Literal["none", "sync", "ours"]
T = TypeVar("T")
_DEADLINE_S = 60.0
_PREWARM_S = 1.0  # forwards before the first measured step, so the GPU clocks are up


def dtype_of(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass(frozen=True, slots=True)
class Step:
    """One step as the model thread left it: when it ended and its output's way out."""

    ended: float
    transfer: Transfer | None  # ours: the copy in flight
    host: torch.Tensor | None  # sync: the output, copied


class Producer:
    """The producing stage's model, in one thread of its own (as ``TorchEngine``)."""

    def __init__(self, config: CudaBenchConfig, *, graph: bool = False) -> None:
        self.config = config
        self.graph = graph
        self._graphs: dict[str, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.device = torch.device(config.device)
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix="bench-cuda-model", initializer=_use, initargs=(self.device,)
        )
        self._model: torch.nn.Module | None = None
        self._inputs: dict[str, torch.Tensor] = {}

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` in the model thread; a future, so the caller awaits it later."""
        return asyncio.wrap_future(self._executor.submit(fn, *args))

    async def start(self) -> None:
        """Build the model and the per-size inputs in the thread, then warm the GPU up."""
        async with asyncio.timeout(_DEADLINE_S * 5):
            await self.call(self._build)
            await self.call(self._prewarm)

    async def stop(self) -> None:
        """Wait for the running step, end the thread and free the weights."""
        await asyncio.to_thread(self._executor.shutdown, True)
        self._model, self._inputs = None, {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _build(self) -> None:
        c, dtype = self.config, dtype_of(self.device)
        torch.manual_seed(c.seed)
        blocks: list[torch.nn.Module] = []
        for _ in range(c.layers):
            blocks += [
                torch.nn.Linear(c.hidden, 4 * c.hidden, device=self.device, dtype=dtype),
                torch.nn.GELU(),
                torch.nn.Linear(4 * c.hidden, c.hidden, device=self.device, dtype=dtype),
            ]
        self._model = torch.nn.Sequential(*blocks).requires_grad_(False)
        self._inputs = {
            size: torch.randn(c.tokens(size), c.hidden, device=self.device, dtype=dtype)
            for size in c.sizes
        }

    def _prewarm(self) -> None:
        if self.device.type != "cuda":
            return
        until = time.perf_counter() + _PREWARM_S
        while time.perf_counter() < until:
            self.forward(self.config.sizes[0])
        torch.cuda.synchronize(self.device)
        if self.graph:
            self._capture()

    @torch.inference_mode()
    def _capture(self) -> None:
        """Each size's forward as one CUDA graph: a step is then one launch, as a GPU
        engine's decode step is (its host side no longer competes with the event loop
        for the interpreter at every kernel)."""
        assert self._model is not None
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for size in self.config.sizes:
                self._model(self._inputs[size])
        torch.cuda.current_stream(self.device).wait_stream(side)
        for size in self.config.sizes:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._model(self._inputs[size])
            self._graphs[size] = (graph, out)
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def forward(self, size: str) -> torch.Tensor:
        """One forward over ``size``'s tokens: the hidden states, on the device."""
        if self._model is None:
            raise RuntimeError("the producer is not started")
        captured = self._graphs.get(size)
        if captured is not None:
            graph, out = captured
            graph.replay()
            return out.clone()  # the next replay overwrites ``out``; a step owns its output
        hidden: torch.Tensor = self._model(self._inputs[size])
        return hidden

    def ready(self, size: str) -> torch.Tensor:
        """A forward's hidden states, with the forward complete."""
        hidden = self.forward(size)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return hidden

    @torch.inference_mode()
    def step(self, size: str, mode: Mode, staging: HostStaging) -> Step:
        """One forward step of the producing stage, its output on its way out per ``mode``."""
        hidden = self.forward(size)
        # ours: the copy is queued behind the forward on a side stream before the token
        # is read, so it overlaps that read and whatever the next step computes.
        transfer = staging.begin({"hidden": hidden}) if mode == "ours" else None
        hidden[-1].argmax().item()  # the sampled token: the step waits for its GPU work
        host = hidden.cpu() if mode == "sync" else None
        return Step(time.perf_counter(), transfer, host)

    @torch.inference_mode()
    def routed_step(
        self, size: str, mark: bool, launched: Callable[[], None]
    ) -> tuple[torch.Tensor, torch.cuda.Event]:
        """One forward step whose output the event loop routes (as a stage's engine
        step): the hidden states, and a timing event recorded right after the forward.

        ``mark``: the output carries the step's mark, as a ``TorchEngine`` call's does
        (:mod:`~omni_actors.cuda.step_ready`); else it carries none. ``launched`` is
        called once the forward is queued on the device, before the step waits for it.
        """
        hidden = self.forward(size)
        ended = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ended.record(torch.cuda.current_stream(self.device))
        if mark:
            mark_step(hidden, self.device, lambda: ended)
        launched()
        hidden[-1].argmax().item()  # the sampled token: the step waits for its GPU work
        return hidden, ended


def _use(device: torch.device) -> None:
    """The model thread computes on ``device`` (the current device is per thread)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
