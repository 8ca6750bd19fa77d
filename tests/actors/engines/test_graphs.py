"""``ShapeGraphs`` around its graphs, on the CPU: a key is captured once and replayed,
each call gets its own outputs, a capture that fails or a graph that differs from eager
leaves its key eager (said in the log, never retried, each eager call counted), and
batches map onto buckets.

CUDA graphs cannot run here; a stand-in capture plays the graph: its replay runs the step
on the static inputs and writes the static outputs in place, as a graph does.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch

from omni_actors.actors.engines.qwen3_omni import graphs as graphs_module
from omni_actors.actors.engines.qwen3_omni.graphs import (
    CudaCapture,
    ShapeGraphs,
    bucket,
    pad_rows,
)


class StandIn:
    """A graph: ``replay`` recomputes ``fn(*inputs)`` into the outputs of the capture;
    ``skew`` is added to every replay's outputs (a graph that differs from eager)."""

    def __init__(
        self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], skew: float = 0.0
    ) -> None:
        self.fn, self.inputs, self.skew = fn, inputs, skew
        self.outputs = fn(*inputs)
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        fresh = self.fn(*self.inputs)
        pairs = [(self.outputs, fresh)] if isinstance(fresh, torch.Tensor) else []
        if not pairs:
            pairs = list(zip(self.outputs, fresh, strict=True))
        for static, new in pairs:
            static.copy_(new + self.skew if static.is_floating_point() else new)


class Captures:
    """The capture :class:`ShapeGraphs` is given: records its graphs; ``fail`` raises as
    an uncapturable op does, ``skew`` makes graphs that differ from eager."""

    def __init__(self, *, fail: bool = False, skew: float = 0.0) -> None:
        self.fail, self.skew = fail, skew
        self.graphs: list[StandIn] = []

    def __call__(self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> StandIn:
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.graphs.append(StandIn(fn, inputs, self.skew))
        return self.graphs[-1]


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_key_is_captured_once_and_replayed_on_each_call_s_inputs() -> None:
    captures = Captures()
    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=captures)
    x = torch.arange(4.0)
    assert torch.equal(graphs(4, double, x), x * 2)
    assert graphs.graphed == [4]
    (graph,) = captures.graphs
    assert graph.replays == 1  # the check against eager at capture
    y = torch.tensor([5.0, -1.0, 0.5, 3.0])
    first = graphs(4, double, y)
    assert graph.replays == 2
    assert torch.equal(first, y * 2)  # the replay read this call's inputs
    assert torch.equal(graphs(4, double, x), x * 2)
    assert torch.equal(first, y * 2)  # ... and each call's outputs are its own
    assert first.data_ptr() != graph.outputs.data_ptr()
    assert len(captures.graphs) == 1
    # Another shape is another key, captured on its own.
    assert torch.equal(graphs(2, double, x[:2]), x[:2] * 2)
    assert graphs.graphed == [4, 2]
    assert graphs.eager == []


def test_tuple_outputs_are_compared_and_copied_one_by_one() -> None:
    def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x.long()

    captures = Captures()
    graphs: ShapeGraphs[str] = ShapeGraphs("split", capture=captures)
    x = torch.tensor([1.5, 2.5])
    graphs("k", split, x)
    plus, whole = graphs("k", split, torch.tensor([3.0, 4.0]))
    assert graphs.graphed == ["k"]
    assert torch.equal(plus, torch.tensor([4.0, 5.0]))
    assert torch.equal(whole, torch.tensor([3, 4]))
    graphs("k", split, x)
    assert torch.equal(plus, torch.tensor([4.0, 5.0]))


def test_a_capture_invalidated_by_an_op_names_the_op_s_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def invalidated(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> StandIn:
        try:
            raise ValueError("an op synchronized the stream")
        finally:  # as capture_end does on the way out of the failed capture
            raise RuntimeError("operation failed due to a previous error during capture")

    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=invalidated)
    x = torch.arange(3.0)
    with caplog.at_level(logging.WARNING):
        assert torch.equal(graphs(3, double, x), x * 2)
    assert (
        "double 3: not captured (operation failed due to a previous error during capture; "
        "first ValueError: an op synchronized the stream; raised at "
    ) in caplog.text
    # Where the op's error was raised, innermost frame first.
    assert re.search(r"raised at [^ ]*test_graphs\.py:\d+ invalidated\); eager", caplog.text)
    assert graphs.eager == [3]


def test_a_failed_cuda_capture_gives_the_next_capture_a_pool_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capture failing inside the step leaves its pool marked as recorded to: the next
    capture must not use it (it would fail with "already recording to mempool_id")."""
    handles = iter([(0, 1), (0, 2)])
    used: list[object] = []
    ended: list[object] = []

    class Fails:
        def __init__(self, fn: Callable[..., Any], inputs: Any, pool: object) -> None:
            used.append(pool)
            if len(used) == 1:
                raise RuntimeError("operation not permitted when stream is capturing")
            self.outputs = fn(*inputs)

        def replay(self) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(handles))
    monkeypatch.setattr(graphs_module, "_CudaGraph", Fails)
    monkeypatch.setattr(graphs_module, "_end_recording", lambda device, pool: ended.append(pool))
    capture = CudaCapture()
    x = torch.arange(3.0)
    with pytest.raises(RuntimeError, match="not permitted"):
        capture._in_pool(double, (x,))
    assert ended == [(0, 1)]
    capture._in_pool(double, (x,))
    capture._in_pool(double, (x,))  # a capture that worked keeps its pool for the next
    assert used == [(0, 1), (0, 2), (0, 2)]


def test_a_capture_runs_on_a_stream_of_its_inputs_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda.graph left to itself captures on one stream per process, made on the
    device current at the first capture: a process with stages on two GPUs then fails
    every capture on the other. Each capture must name a stream of its inputs' device."""
    made: list[int] = []
    captured_on: list[int] = []

    class Stream:
        def __init__(self, device: torch.device | int | None = None) -> None:
            self.device = torch.device("cuda", device) if isinstance(device, int) else device
            made.append(self.device.index if self.device is not None else -1)

        def wait_stream(self, other: object) -> None:
            pass

    class Capturing:
        def __init__(self, graph: object, pool: object = None, stream: Any = None, **_: Any):
            captured_on.append(-1 if stream is None else stream.device.index)

        def __enter__(self) -> None:
            pass

        def __exit__(self, *_: object) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(torch.cuda, "graph", Capturing)

    class OnGpu:  # an input of the step, on a GPU
        def __init__(self, index: int) -> None:
            self.device = torch.device("cuda", index)

    for index in (1, 0):  # a stage on cuda:1 captures first, then one on cuda:0
        graphs_module._CudaGraph(lambda x: x, (cast(Any, OnGpu(index)),), cast(Any, (0, index)))
    assert captured_on == [1, 0]


def test_a_graph_holding_nan_where_eager_does_is_exact() -> None:
    def log(x: torch.Tensor) -> torch.Tensor:
        return x.log()

    graphs: ShapeGraphs[int] = ShapeGraphs("log", capture=Captures())
    out = graphs(1, log, torch.tensor([-1.0, 1.0]))
    assert out.isnan()[0]
    assert graphs.graphed == [1]


def test_a_failed_capture_leaves_its_key_eager_and_is_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    captures = Captures(fail=True)
    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=captures)
    x = torch.arange(3.0)
    with caplog.at_level(logging.WARNING):
        assert torch.equal(graphs(3, double, x), x * 2)
    assert "double 3: not captured (operation not permitted" in caplog.text
    assert graphs.eager == [3]
    assert graphs.graphed == []
    captures.fail = False  # a retry would now capture: there must be none
    caplog.clear()
    assert torch.equal(graphs(3, double, x + 1), (x + 1) * 2)
    assert graphs.capture(3, double, x) is False
    assert captures.graphs == []
    assert caplog.text == ""  # said once


def test_a_graph_that_differs_from_eager_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    captures = Captures(skew=1e-6)  # a few ulps off: bit for bit or nothing
    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=captures)
    x = torch.arange(3.0) + 1
    with caplog.at_level(logging.WARNING):
        assert torch.equal(graphs(3, double, x), x * 2)
    assert (
        "double 3: the graph differs from eager"
        " (output 0: max |diff| 9.54e-07 (1.6e-07 of max |eager|)); eager" in caplog.text
    )
    assert graphs.eager == [3]
    (graph,) = captures.graphs
    replays = graph.replays
    assert torch.equal(graphs(3, double, x), x * 2)  # eager from now on
    assert graph.replays == replays


def test_capture_warms_a_key_once() -> None:
    captures = Captures()
    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=captures)
    assert graphs.capture(2, double, torch.zeros(2)) is True
    assert graphs.capture(2, double, torch.zeros(2)) is True
    assert len(captures.graphs) == 1
    assert torch.equal(graphs(2, double, torch.ones(2)), torch.full((2,), 2.0))
    assert len(captures.graphs) == 1


def test_calls_replayed_from_their_graph_are_not_counted_eager() -> None:
    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=Captures())
    x = torch.arange(3.0)
    graphs(3, double, x)  # captured: its eager result is the capture's check, not a fallback
    graphs(3, double, x)
    graphs(3, double, x)
    assert graphs.eager_steps == 0


@pytest.mark.parametrize(
    "captures", [Captures(fail=True), Captures(skew=1e-6)], ids=["fails", "differs"]
)
def test_each_call_of_a_key_without_a_good_graph_counts_eager(captures: Captures) -> None:
    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=captures)
    x = torch.arange(3.0)
    assert graphs.capture(2, double, x[:2]) is False  # warming a key runs no step
    assert graphs.eager_steps == 0
    graphs(3, double, x)  # its first call: the capture failed or differed
    assert graphs.eager_steps == 1
    graphs(3, double, x)
    graphs(2, double, x[:2])
    assert graphs.eager_steps == 3


def test_a_step_run_eager_for_want_of_a_graph_counts() -> None:
    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=Captures())
    x = torch.arange(5.0)
    assert torch.equal(graphs.run_eager(double, x), x * 2)
    assert graphs.eager_steps == 1
    assert graphs.graphed == []  # no key was tried
    assert graphs.eager == []


def test_inputs_unlike_the_captured_ones_are_refused() -> None:
    graphs: ShapeGraphs[int] = ShapeGraphs("double", capture=Captures())
    graphs(2, double, torch.zeros(2))
    with pytest.raises(ValueError, match=r"double 2: captured for inputs \[\(\(2,\)"):
        graphs(2, double, torch.zeros(3))
    with pytest.raises(ValueError, match="captured for inputs"):
        graphs(2, double, torch.zeros(2, dtype=torch.float64))


def test_cuda_capture_refuses_host_tensors() -> None:
    with pytest.raises(ValueError, match=r"need inputs on a CUDA device, got \['cpu'\]"):
        CudaCapture()(double, (torch.zeros(2),))


def test_a_batch_runs_as_the_smallest_bucket_that_holds_it() -> None:
    buckets = (1, 2, 4, 8, 16, 32)
    assert [bucket(n, buckets) for n in (1, 2, 3, 4, 5, 9, 16, 17, 32)] == [
        1,
        2,
        4,
        4,
        8,
        16,
        16,
        32,
        32,
    ]
    assert bucket(33, buckets) is None
    assert bucket(3, (8, 2)) == 8  # any order
    assert bucket(1, ()) is None
    with pytest.raises(ValueError, match="at least one row"):
        bucket(0, buckets)


def test_rows_are_padded_with_copies_of_the_last() -> None:
    rows = torch.arange(6).view(2, 3)
    padded = pad_rows(rows, 4)
    assert torch.equal(padded[:2], rows)
    assert torch.equal(padded[2:], rows[1:].expand(2, 3))
    assert padded.is_contiguous()
    assert pad_rows(rows, 2) is rows
    with pytest.raises(ValueError, match="cannot pad 2 rows to 1"):
        pad_rows(rows, 1)
    with pytest.raises(ValueError, match="cannot pad 0 rows"):
        pad_rows(rows[:0], 4)
