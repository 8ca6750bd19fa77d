"""``ShapeGraphs``: a launch-bound step replayed from one CUDA graph per exact shape.

A step of small kernels (a code-predictor frame, a code2wav window at a small batch) is
bound by kernel launches on a GPU, not by its arithmetic; replaying it from a CUDA graph
launches it all at once. A graph is only valid for the shapes it was captured with, so
the caller names each shape with a key (a batch size; a batch bucket and window length)
and :class:`ShapeGraphs` captures that key's graph the first time it is asked for, then
replays it for every later call with that key.

Each graph is checked when it is captured: on the capture's inputs, its replay must give
the eager step's outputs bit for bit. A graph that differs, or a step that cannot be
captured (an op that reads the device from the host, an allocation that fails), leaves
that key eager for good, and says so in the log once. The result is then never wrong,
only slower; every such eager call is counted (:attr:`ShapeGraphs.eager_steps`), as are
the steps a caller runs eager for want of a graph (:meth:`ShapeGraphs.run_eager`: more
rows than its largest graph holds), so a server can tell it lost its graphs.

What a captured step must be: a function of its input tensors (same shapes, dtypes and
device at every call with its key) that returns a tensor or a tuple of tensors, reads no
device value from the host, and draws no random numbers. It may use other tensors it
closes over (weights, a static cache it writes), which the graph uses where they are at
capture; as a capture runs the step several times on the same inputs (eager, warm-up,
the check), what it writes there must be the same each time.

Memory: the graphs of one :class:`ShapeGraphs` share one memory pool, so the
intermediates of all its shapes take the room of the largest step's, not the sum. That
is safe here because replays run one at a time on one stream, and each replay's outputs
are copied out before the next replay may reuse what a capture freed. Batch buckets
(:func:`bucket`, :func:`pad_rows`) keep the number of shapes small: a batch runs as the
smallest bucket that holds it, padded with copies of its last row.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # what graph_pool_handle() returns

__all__ = [
    "DEFAULT_BUCKETS",
    "Capture",
    "CudaCapture",
    "Graph",
    "ShapeGraphs",
    "bucket",
    "pad_rows",
]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
Out = TypeVar("Out", torch.Tensor, tuple[torch.Tensor, ...])

DEFAULT_BUCKETS: Final = (1, 2, 4, 8, 16, 32)
"""Batch sizes graphs are captured for: a batch runs as the smallest that holds it."""

_WARMUP = 3  # eager runs on a side stream before capture, as CUDA graphs want
_FRAMES = 6  # frames of a failed capture's first error named in the log

SETUP: Final = threading.RLock()
"""Held while a thread of this process sets up device state that another thread's
device work must not overlap: a stage's build and load (transformers sets torch's
process-wide default dtype while it builds) and every graph capture (another thread's
work on the device's legacy default stream, such as a stage's weights copied in while
it loads, invalidates a capture under way). Engines load in threads of their own, so
two stages sharing a process take turns; graphs captured at load (``warm``) then never
race another stage's loading."""


class Graph(Protocol):
    """A captured step: :meth:`replay` recomputes ``outputs`` from the static inputs it
    was captured on (whatever they hold now), in place."""

    @property
    def outputs(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The step's outputs, overwritten by each replay."""
        ...

    def replay(self) -> None:
        """Run the step again on the static inputs' current values."""
        ...


Capture = Callable[[Callable[..., Any], tuple[torch.Tensor, ...]], Graph]
"""``capture(fn, inputs)`` -> the graph of ``fn(*inputs)``, ``inputs`` being the static
input tensors later replays read. Raises ``RuntimeError`` where ``fn`` cannot be captured."""


class _CudaGraph:
    """``fn(*inputs)`` captured on the inputs' device, in ``pool``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: tuple[torch.Tensor, ...],
        pool: _POOL_HANDLE,
    ) -> None:
        self._device = device = inputs[0].device
        # On the inputs' device whatever the thread's current one is: a capture follows
        # the current device's stream, and would record nothing of kernels that run on
        # another device's (then the replay would silently return stale outputs).
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(_WARMUP):
                    fn(*inputs)
            torch.cuda.current_stream(device).wait_stream(side)
            self._graph = torch.cuda.CUDAGraph()
            # Captured on that side stream, of the inputs' device: left to itself,
            # torch.cuda.graph captures on one stream per process, made on whichever
            # device was current at the first capture, so in a process whose stages
            # sit on two GPUs every capture on the other one fails.
            # thread_local: the stage's other threads keep using the device meanwhile
            # (its transfers query events and pointers), which a global capture would
            # forbid.
            with torch.cuda.graph(
                self._graph, pool=pool, stream=side, capture_error_mode="thread_local"
            ):
                self._outputs: torch.Tensor | tuple[torch.Tensor, ...] = fn(*inputs)

    @property
    def outputs(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self._outputs

    def replay(self) -> None:
        with torch.cuda.device(self._device):
            self._graph.replay()


class CudaCapture:
    """The :data:`Capture` of a CUDA device: warm-up runs on a side stream, then the
    capture, every graph in one memory pool (see the module docstring)."""

    def __init__(self) -> None:
        self._pool: _POOL_HANDLE | None = None

    def __call__(self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> Graph:
        """Capture ``fn(*inputs)``; the inputs must be on one CUDA device.

        Raises:
            ValueError: an input is not on a CUDA device.
            RuntimeError: ``fn`` cannot be captured.
        """
        if not inputs or any(t.device.type != "cuda" for t in inputs):
            devices = sorted({str(t.device) for t in inputs})
            raise ValueError(f"CUDA graphs need inputs on a CUDA device, got {devices or 'none'}")
        return self._in_pool(fn, inputs)

    def _in_pool(self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> Graph:
        pool = self._pool
        if pool is None:
            pool = self._pool = torch.cuda.graph_pool_handle()
        try:
            return _CudaGraph(fn, inputs, pool)
        except RuntimeError:
            # A capture that fails inside the step leaves its pool marked as being
            # recorded to (``capture_end`` raises before it ends the allocation to the
            # pool), and every later capture into that pool would fail with "already
            # recording to mempool_id": end it if this torch can, and give the next
            # capture a pool of its own either way.
            self._pool = None
            _end_recording(inputs[0].device, pool)
            raise


def _end_recording(device: torch.device, pool: _POOL_HANDLE) -> None:
    """End a failed capture's allocation to ``pool`` (private torch API: where it is
    missing or refuses, the pool is only abandoned)."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is None:
        return
    try:
        end(device.index if device.index is not None else torch.cuda.current_device(), pool)
    except RuntimeError:
        log.debug("could not end a failed capture's pool", exc_info=True)


@dataclass(eq=False, slots=True)
class _Captured:
    """One key's graph and the static inputs it reads."""

    graph: Graph
    inputs: tuple[torch.Tensor, ...]

    def run(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        for static, given in zip(self.inputs, inputs, strict=True):
            static.copy_(given)
        self.graph.replay()
        # The next replay overwrites the static outputs: each call gets its own.
        return _map(torch.clone, self.graph.outputs)


class ShapeGraphs(Generic[K]):
    """``fn(*inputs)`` replayed from a CUDA graph per key, where the graph is exact; see
    the module docstring. Call it on the thread that computes on the device (it is not
    thread-safe).

    Args:
        name: the step, for the log (``"code predictor"``).
        capture: how a graph is captured (default: a :class:`CudaCapture`); tests pass
            one that fails or differs, to check the eager fallback on a machine without
            a GPU.
    """

    def __init__(self, name: str, *, capture: Capture | None = None) -> None:
        self.name = name
        self._capture: Capture = capture if capture is not None else CudaCapture()
        self._graphs: dict[K, _Captured | None] = {}  # None: that key stays eager
        self.capture_s: dict[K, float] = {}
        """Seconds each key took to capture and check (eager ones included)."""
        self.eager_steps = 0
        """Calls that ran eager for want of a graph: a key that could not be captured
        or whose graph differed from eager (its first call included), and
        :meth:`run_eager`'s. A first call whose graph is captured is not one."""

    @property
    def graphed(self) -> list[K]:
        """Keys replayed from a graph, in the order they were captured."""
        return [key for key, graph in self._graphs.items() if graph is not None]

    @property
    def eager(self) -> list[K]:
        """Keys that could not be captured, or whose graph differed from eager."""
        return [key for key, graph in self._graphs.items() if graph is None]

    def __call__(self, key: K, fn: Callable[..., Out], *inputs: torch.Tensor) -> Out:
        """``fn(*inputs)``: replayed from ``key``'s graph, captured now if this is the
        key's first call (that call's result is the eager one the graph was checked on).

        Every call with one key must pass the same ``fn`` (a later one is not looked at
        once the key is captured) and inputs of the same shapes, dtypes and devices.

        Raises:
            ValueError: the inputs differ from those ``key`` was captured with.
        """
        if key not in self._graphs:
            eager, self._graphs[key] = self._try(key, fn, inputs)
            if self._graphs[key] is None:
                self.eager_steps += 1
            return eager
        captured = self._graphs[key]
        if captured is None:
            return self.run_eager(fn, *inputs)
        if [_spec(t) for t in inputs] != [_spec(t) for t in captured.inputs]:
            raise ValueError(
                f"{self.name} {key!r}: captured for inputs "
                f"{[_spec(t) for t in captured.inputs]}, got {[_spec(t) for t in inputs]}"
            )
        return cast(Out, captured.run(inputs))

    def run_eager(self, fn: Callable[..., Out], *inputs: torch.Tensor) -> Out:
        """``fn(*inputs)`` eager, counted in :attr:`eager_steps`: for a step the caller
        has no graph for (more rows than its largest graph holds). A step run eager on
        purpose (a benchmark's comparison) calls ``fn`` itself, uncounted."""
        self.eager_steps += 1
        with torch.no_grad():
            return fn(*inputs)

    def capture(self, key: K, fn: Callable[..., Out], *inputs: torch.Tensor) -> bool:
        """Capture ``key``'s graph now, on ``inputs``, unless it was tried already (so no
        later call waits for it); whether ``key`` replays from a graph."""
        if key not in self._graphs:
            self._graphs[key] = self._try(key, fn, inputs)[1]
        return self._graphs[key] is not None

    def _try(
        self, key: K, fn: Callable[..., Out], inputs: tuple[torch.Tensor, ...]
    ) -> tuple[Out, _Captured | None]:
        """The eager result on ``inputs``, and the graph if it gives the same, bit for bit."""
        started = time.perf_counter()
        try:
            with SETUP:
                return self._check(key, fn, inputs)
        finally:
            self.capture_s[key] = time.perf_counter() - started

    def _check(
        self, key: K, fn: Callable[..., Out], inputs: tuple[torch.Tensor, ...]
    ) -> tuple[Out, _Captured | None]:
        with torch.no_grad():
            eager = fn(*inputs)
            static = tuple(t.clone() for t in inputs)
            try:
                captured = _Captured(self._capture(fn, static), static)
            except RuntimeError as exc:  # an op that cannot be captured: stay eager
                # An op that fails mid-capture is followed by the capture's own failure
                # (the stream capture is invalidated) while its error is handled: the
                # op's error is the one that says what to fix, so name it too.
                first = exc.__context__ or exc
                why = str(exc) if first is exc else f"{exc}; first {type(first).__name__}: {first}"
                why = f"{why}; raised at {_where(first)}"
                log.warning("%s %r: not captured (%s); eager", self.name, key, why)
                return eager, None
            replayed = captured.run(inputs)
            if not _equal(replayed, eager):
                log.warning(
                    "%s %r: the graph differs from eager (%s); eager",
                    self.name,
                    key,
                    _difference(replayed, eager),
                )
                return eager, None
        log.debug("%s %r: captured", self.name, key)
        return eager, captured


def _where(error: BaseException) -> str:
    """The innermost frames an error was raised through, innermost first: the op to fix
    is among them (a library's file named from its package on)."""
    frames = traceback.extract_tb(error.__traceback__)[-_FRAMES:]
    return " <- ".join(
        f"{frame.filename.rpartition('site-packages/')[2]}:{frame.lineno} {frame.name}"
        for frame in reversed(frames)
    )


def bucket(rows: int, buckets: Sequence[int]) -> int | None:
    """The smallest of ``buckets`` that holds ``rows``; None if none does.

    Raises:
        ValueError: ``rows`` is below 1.
    """
    if rows < 1:
        raise ValueError(f"a batch has at least one row, got {rows}")
    return min((size for size in buckets if size >= rows), default=None)


def pad_rows(rows: torch.Tensor, size: int) -> torch.Tensor:
    """``rows`` with copies of its last row added along dim 0 up to ``size`` rows.

    Copies, not zeros: a padded row is a valid input (codes in range), and the real rows
    of a row-wise step are unchanged by it. The padded rows' outputs are to be dropped.

    Raises:
        ValueError: ``rows`` is empty or has more than ``size`` rows.
    """
    have = rows.shape[0] if rows.dim() else 0
    if not 0 < have <= size:
        raise ValueError(f"cannot pad {have} rows to {size}")
    if have == size:
        return rows
    return torch.cat((rows, rows[-1:].expand(size - have, *rows.shape[1:])))


def _spec(tensor: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, torch.device]:
    return tuple(tensor.shape), tensor.dtype, tensor.device


def _map(
    fn: Callable[[torch.Tensor], torch.Tensor], value: torch.Tensor | tuple[torch.Tensor, ...]
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    return fn(value) if isinstance(value, torch.Tensor) else tuple(fn(t) for t in value)


def _equal(
    a: torch.Tensor | tuple[torch.Tensor, ...], b: torch.Tensor | tuple[torch.Tensor, ...]
) -> bool:
    """Bit for bit the same outputs: shapes, dtypes and stored bits (torch.equal says no
    where both hold the same NaN)."""
    left = (a,) if isinstance(a, torch.Tensor) else a
    right = (b,) if isinstance(b, torch.Tensor) else b
    return len(left) == len(right) and all(
        _same_bits(x, y) for x, y in zip(left, right, strict=True)
    )


def _difference(
    a: torch.Tensor | tuple[torch.Tensor, ...], b: torch.Tensor | tuple[torch.Tensor, ...]
) -> str:
    """How far apart two step outputs are, for the log: a real error and a rounding
    difference (another kernel for the same sum) read differently."""
    left = (a,) if isinstance(a, torch.Tensor) else a
    right = (b,) if isinstance(b, torch.Tensor) else b
    if len(left) != len(right):
        return f"{len(left)} outputs, eager has {len(right)}"
    parts = []
    for n, (x, y) in enumerate(zip(left, right, strict=True)):
        if x.shape != y.shape or x.dtype != y.dtype:
            parts.append(f"output {n}: {x.dtype}{list(x.shape)}, eager {y.dtype}{list(y.shape)}")
        elif not x.is_floating_point():
            parts.append(f"output {n}: {int((x != y).sum())} of {x.numel()} values differ")
        else:
            diff = (x.double() - y.double()).abs().nan_to_num(nan=float("inf"))
            worst = diff.max().item()
            scale = y.double().abs().max().item() or 1.0
            parts.append(f"output {n}: max |diff| {worst:.3g} ({worst / scale:.2g} of max |eager|)")
    return "; ".join(parts)


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.is_floating_point() and x.element_size() in _INT_OF:
        bits = _INT_OF[x.element_size()]
        return torch.equal(x.view(bits), y.view(bits))
    return torch.equal(x, y)


_INT_OF: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
