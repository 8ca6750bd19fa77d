"""Step marks without CUDA: which tensors a step marks, which tensors carry the mark
later (views, made in inference mode or not, but not copies), and what a copy stream is
made to wait on (the marks when every tensor has one, else the producing stream), and
what a step's rows concatenated into one tensor carry (a mark of their own, recorded
after the concatenation, which waited on the parts' marks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from omni_actors.cuda.step_ready import cat_ready, mark_step, step_mark, wait_ready

CPU = torch.device("cpu")


class Recorder:
    """A stream that notes what it was made to wait on."""

    def __init__(self) -> None:
        self.waits: list[tuple[str, Any]] = []

    def wait_event(self, event: Any) -> None:
        self.waits.append(("event", event))

    def wait_stream(self, stream: Any) -> None:
        self.waits.append(("stream", stream))


def test_a_step_marks_every_tensor_of_its_result_on_its_device() -> None:
    with torch.inference_mode():
        token, embed, rows = torch.tensor([7]), torch.randn(2, 4), torch.randn(3, 4)
    elsewhere = torch.empty(3, device="meta")
    recorded: list[str] = []

    def record() -> str:
        recorded.append("E")
        return "E"

    result = [(token, {"embed": embed, "rows": [rows[0], rows[1]]}), elsewhere, "text", 3]
    assert mark_step(result, CPU, record) == "E"

    assert recorded == ["E"]  # one event for the whole step
    for tensor in (token, embed, rows):
        assert step_mark(tensor) == "E"
    assert step_mark(elsewhere) is None  # another device: not this step's stream


@dataclass(frozen=True, slots=True)
class _Output:
    rows: torch.Tensor | None
    token: tuple[int, torch.Tensor] | None


class _Message(msgspec.Struct):
    hidden: Any
    text: str


def test_a_step_marks_the_tensors_of_the_records_it_returns() -> None:
    """A step loop's outputs are records, one per chunk (the thinker's rows and token):
    each of their tensors carries the step's mark, so a copy of a session's rows waits
    for that step, not for the next one the model thread has queued since."""
    with torch.inference_mode():
        rows, embed, hidden = torch.randn(3, 4), torch.randn(1, 4), torch.randn(2, 4)
    result = [_Output(rows, (5, embed)), _Output(None, None), _Message(hidden, "hi"), None]
    assert mark_step(result, CPU, lambda: "E") == "E"
    for tensor in (rows, embed, hidden):
        assert step_mark(tensor) == "E"
    assert step_mark(rows[1]) == "E"  # the session's own rows, sliced on the loop
    copy = Recorder()
    assert wait_ready(copy, [rows[1:], embed], "compute stream")
    assert copy.waits == [("event", "E")]
    assert mark_step([_Output], CPU, lambda: "class") is None  # a class holds no tensors


def test_the_qwen3_omni_engines_outputs_are_marked() -> None:
    from omni_actors.actors.engines.qwen3_omni.talker_model import Framed
    from omni_actors.actors.engines.qwen3_omni.thinker_model import Fed

    with torch.inference_mode():
        rows, embed, codes, hidden = (torch.randn(2, 4) for _ in range(4))
    assert mark_step([Fed(rows, (3, embed)), Framed((codes, hidden))], CPU, lambda: "E") == "E"
    assert all(step_mark(t) == "E" for t in (rows, embed, codes, hidden))


def test_nothing_to_mark_records_nothing() -> None:
    def record() -> str:
        raise AssertionError("no tensor on the device: no event")

    assert mark_step(None, CPU, record) is None
    assert mark_step({"text": "hi", "ids": [1, 2]}, CPU, record) is None
    assert mark_step(torch.empty(2, device="meta"), CPU, record) is None


def test_views_made_later_carry_the_mark_and_copies_do_not() -> None:
    with torch.inference_mode():
        batch = torch.randn(4, 8)
    mark_step(batch, CPU, lambda: "E")

    assert step_mark(batch[1]) == "E"  # a session's row, made on the loop
    assert step_mark(batch[1:3].t()) == "E"
    assert step_mark(batch.view(torch.int32)) == "E"
    with torch.inference_mode():
        assert step_mark(batch[2]) == "E"
    assert step_mark(batch.clone()) is None  # new memory: made by whoever cloned it
    assert step_mark(torch.randn(4, 8)) is None


def test_a_later_step_that_returns_the_same_memory_marks_it_again() -> None:
    static = torch.zeros(4)  # an output buffer a graph replays into
    mark_step(static, CPU, lambda: "first")
    mark_step(static[:2], CPU, lambda: "second")
    assert step_mark(static) == "second"


def test_marked_tensors_make_the_copy_wait_on_their_marks_only() -> None:
    a, b, c = torch.randn(2), torch.randn(2), torch.randn(2)
    mark_step((a, b), CPU, lambda: "step 1")
    mark_step(c, CPU, lambda: "step 2")
    stream = Recorder()

    assert wait_ready(stream, [a, b[1:], c], fallback="compute")

    assert stream.waits == [("event", "step 1"), ("event", "step 2")]


def test_one_unmarked_tensor_makes_the_copy_wait_on_the_producing_stream() -> None:
    marked, unmarked = torch.randn(2), torch.randn(2)
    mark_step(marked, CPU, lambda: "step")
    stream = Recorder()

    assert not wait_ready(stream, [marked, unmarked], fallback="compute")

    assert stream.waits == [("stream", "compute")]


def test_no_tensors_no_wait() -> None:
    stream = Recorder()
    assert wait_ready(stream, [], fallback="compute")
    assert stream.waits == []


def test_a_concatenation_waits_on_its_parts_marks_and_carries_its_own() -> None:
    rows = torch.arange(8.0).reshape(4, 2)
    mark_step(rows, CPU, lambda: "step 1")
    other = torch.ones(1, 2)
    mark_step(other, CPU, lambda: "step 2")
    stream = Recorder()

    packed = cat_ready([rows[:1], other, rows[2:]], stream, "compute", lambda: "packed")

    assert torch.equal(packed, torch.cat([rows[:1], other, rows[2:]]))
    assert stream.waits == [("event", "step 1"), ("event", "step 2")]
    assert step_mark(packed) == "packed"
    assert step_mark(packed[1:]) == "packed"  # a copy of the packed rows waits on it only
    later = Recorder()
    assert wait_ready(later, [packed], fallback="compute")
    assert later.waits == [("event", "packed")]


def test_a_concatenation_of_an_unmarked_part_waits_on_the_producing_stream() -> None:
    marked = torch.ones(1, 2)
    mark_step(marked, CPU, lambda: "step")
    stream = Recorder()

    packed = cat_ready([marked, torch.zeros(1, 2)], stream, "compute", lambda: "packed")

    assert stream.waits == [("stream", "compute")]
    assert step_mark(packed) == "packed"
