"""The step loop's schedule, update and ownership, with a model that records its steps."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from omni_actors.actors.engines.step_loop import (
    STEP_TRACE_ENV,
    Chunk,
    ContextLengthError,
    RequestClosedError,
    SlotsExhaustedError,
    StepLoop,
)
from omni_actors.testing import consistently, eventually

Step = list[tuple[str, int, int, bool]]  # (request, start, length, decode) per chunk


class Model:
    """Records every step; ``hold`` keeps a step running until released; ``fail`` makes
    the next step raise."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.hold: asyncio.Event | None = None
        self.fail = False

    async def __call__(self, chunks: list[Chunk[str, str]]) -> list[str]:
        self.steps.append([(c.request.id, c.start, c.length, c.work.decode) for c in chunks])
        if self.hold is not None:
            await self.hold.wait()
        if self.fail:
            self.fail = False
            raise RuntimeError("step broke")
        return [f"{c.work.payload}@{c.start}+{c.length}" for c in chunks]


@asynccontextmanager
async def running(
    model: Model,
    *,
    slots: int = 4,
    budget: int = 8,
    chunk: int = 4,
    context: int = 64,
    wait_s: float = 0.0,
    whole_fresh: bool = False,
    decode_ahead: int = 0,
) -> AsyncIterator[StepLoop[str, str]]:
    loop: StepLoop[str, str] = StepLoop(
        model,
        slots=slots,
        max_context=context,
        max_tokens_per_step=budget,
        max_chunk=chunk,
        wait_s=wait_s,
        whole_fresh_prefills=whole_fresh,
        decode_ahead=decode_ahead,
    )
    loop.start()
    try:
        yield loop
    finally:
        if model.hold is not None:
            model.hold.set()  # a test that failed holding a step lets it end
        await loop.stop()


async def test_a_step_runs_every_decode_row_then_prefill_chunks_oldest_first() -> None:
    model = Model()
    model.hold = asyncio.Event()
    async with running(model, budget=8, chunk=4) as loop:
        a, b, c, d = (loop.open(name) for name in "abcd")
        first = loop.submit(a, "p", 2)  # a step to hold the loop while the rest queue
        await eventually(lambda: model.steps)
        later = [
            loop.submit(b, "prompt", 10),
            loop.submit(c, "token", 1, decode=True),
            loop.submit(d, "prompt", 3),
        ]
        model.hold.set()
        await first
        outputs = await asyncio.gather(*later)
    assert model.steps[1] == [("c", 0, 1, True), ("b", 0, 4, False), ("d", 0, 3, False)]
    assert model.steps[2] == [("b", 4, 4, False)]
    assert model.steps[3] == [("b", 8, 2, False)]
    assert outputs[0] == ["prompt@0+4", "prompt@4+4", "prompt@8+2"]  # one per chunk
    assert (b.computed, c.computed, d.computed) == (10, 1, 3)


async def test_an_idle_loop_gathers_for_wait_s_before_its_first_step() -> None:
    model = Model()
    async with running(model, wait_s=0.5) as loop:
        a, b = loop.open("a"), loop.open("b")
        first = loop.submit(a, "x", 1, decode=True)
        await consistently(lambda: model.steps == [], duration=0.05)
        second = loop.submit(b, "y", 1, decode=True)
        assert (await first, await second) == (["x@0+1"], ["y@0+1"])
    assert model.steps == [[("a", 0, 1, True), ("b", 0, 1, True)]]


async def test_the_budget_caps_decode_rows_and_chunks_alike() -> None:
    model = Model()
    model.hold = asyncio.Event()
    async with running(model, budget=3, chunk=8, slots=6) as loop:
        held = loop.open("held")
        first = loop.submit(held, "p", 1)
        await eventually(lambda: model.steps)
        rows = [loop.submit(loop.open(f"r{i}"), "t", 1, decode=True) for i in range(4)]
        model.hold.set()
        await first
        await asyncio.gather(*rows)
        stats = loop.statistics()
    assert [len(step) for step in model.steps[1:]] == [3, 1]
    assert stats.largest_step == 3
    assert stats.decode_rows == 4


async def test_a_failed_step_fails_its_works_and_the_loop_goes_on() -> None:
    model = Model()
    async with running(model) as loop:
        a = loop.open("a")
        model.fail = True
        with pytest.raises(RuntimeError, match="step broke"):
            await loop.submit(a, "x", 2)
        assert await loop.submit(a, "y", 1) == ["y@0+1"]


async def test_a_closed_request_fails_its_work_and_frees_its_slot_after_the_step() -> None:
    model = Model()
    model.hold = asyncio.Event()
    async with running(model, slots=1) as loop:
        a = loop.open("a")
        running_work = loop.submit(a, "x", 2)
        await eventually(lambda: model.steps)
        queued = loop.submit(a, "y", 1)
        loop.close(a)
        for work in (running_work, queued):  # the running one's result will be dropped
            with pytest.raises(RequestClosedError):
                await work
        with pytest.raises(SlotsExhaustedError, match="max_sessions"):
            loop.open("b")  # the running step still writes a's slot
        model.hold.set()
        await eventually(lambda: loop.statistics().free_slots == 1)
        b = loop.open("b")
        assert b.slot == a.slot


async def test_a_rewind_takes_effect_in_the_request_s_order() -> None:
    """At once when nothing is in flight; behind the work queued or running before it
    otherwise (a session moving on from a step it gave up)."""
    model = Model()
    model.hold = asyncio.Event()
    async with running(model) as loop:
        a = loop.open("a")
        work = loop.submit(a, "x", 3)
        await eventually(lambda: model.steps)
        loop.rewind(a, 1)  # the running step will leave 3: the rewind waits for it
        after = loop.submit(a, "y", 1)
        assert a.computed == 0
        model.hold.set()
        await work
        assert await after == ["y@1+1"]
        assert a.computed == 2
        with pytest.raises(ValueError, match="cannot rewind"):
            loop.rewind(a, 4)
        loop.rewind(a, 1)
        assert a.computed == 1
        assert await loop.submit(a, "z", 1) == ["z@1+1"]


async def test_work_past_max_context_is_refused_before_it_is_queued() -> None:
    model = Model()
    async with running(model, context=8) as loop:
        a = loop.open("a")
        await loop.submit(a, "x", 5)
        queued = loop.submit(a, "y", 2)
        with pytest.raises(ContextLengthError, match="max_context"):
            loop.submit(a, "z", 2)  # 5 held + 2 queued + 2 > 8
        await queued
    assert model.steps[-1] == [("a", 5, 2, False)]


async def test_stop_fails_queued_work_and_refuses_new_work() -> None:
    model = Model()
    model.hold = asyncio.Event()
    loop: StepLoop[str, str] = StepLoop(
        model, slots=2, max_context=8, max_tokens_per_step=4, max_chunk=4
    )
    loop.start()
    a = loop.open("a")
    first = loop.submit(a, "x", 1)
    await eventually(lambda: model.steps)
    queued = loop.submit(a, "y", 1)
    stopping = asyncio.ensure_future(loop.stop())
    await eventually(lambda: not loop.running)
    model.hold.set()
    await stopping
    for future in (first, queued):
        with pytest.raises(RequestClosedError):
            await future
    with pytest.raises(RequestClosedError):
        loop.submit(a, "z", 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda m: StepLoop(m, slots=0, max_context=8, max_tokens_per_step=4, max_chunk=4),
        lambda m: StepLoop(m, slots=1, max_context=8, max_tokens_per_step=0, max_chunk=4),
        lambda m: StepLoop(
            m, slots=1, max_context=8, max_tokens_per_step=4, max_chunk=4, wait_s=-1
        ),
        lambda m: StepLoop(
            m, slots=1, max_context=8, max_tokens_per_step=4, max_chunk=4, decode_ahead=-1
        ),
    ],
)
def test_a_loop_needs_room(make: Callable[[Model], object]) -> None:
    with pytest.raises(ValueError, match=">= "):
        make(Model())


async def test_each_step_logs_its_shape_and_time_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A deployer finds where a stage's time goes from the debug log: one line per step."""
    model = Model()
    caplog.set_level(logging.DEBUG, logger="omni_actors.actors.engines.step_loop")
    async with running(model, budget=8, chunk=4) as loop:
        a, b = loop.open("a"), loop.open("b")
        await loop.submit(a, "prompt", 3)
        await asyncio.gather(loop.submit(a, "t", 1, decode=True), loop.submit(b, "p", 2))
    lines = [r.getMessage() for r in caplog.records if "step " in r.getMessage()]
    assert len(lines) == len(model.steps) == 2
    assert lines[0].startswith("step loop: step 1, 0 decode rows, 1 prefill chunks of 3 ")
    assert lines[1].startswith("step loop: step 2, 1 decode rows, 1 prefill chunks of 2 ")
    assert lines[1].endswith(" ms")


async def test_a_request_s_prefills_queued_back_to_back_share_a_step() -> None:
    """A prompt and the reply's opening queued together cost one forward, not two; the
    per-request cap still splits what does not fit, and a decode ends the run."""
    model = Model()
    model.hold = asyncio.Event()
    async with running(model, budget=16, chunk=6) as loop:
        held, a = loop.open("held"), loop.open("a")
        first = loop.submit(held, "p", 1)
        await eventually(lambda: model.steps)
        works = [
            loop.submit(a, "prompt", 3),
            loop.submit(a, "opening", 2),
            loop.submit(a, "more", 4),
            loop.submit(a, "t", 1, decode=True),
        ]
        model.hold.set()
        await first
        outputs = await asyncio.gather(*works)
    assert model.steps[1] == [("a", 0, 3, False), ("a", 3, 2, False), ("a", 5, 1, False)]
    assert model.steps[2] == [("a", 6, 3, False)]
    assert model.steps[3] == [("a", 9, 1, True)]
    assert outputs == [["prompt@0+3"], ["opening@3+2"], ["more@5+1", "more@6+3"], ["t@9+1"]]
    assert a.computed == 10


@pytest.mark.parametrize("whole_fresh", [False, True])
async def test_whole_fresh_prefills_wait_a_step_rather_than_split(whole_fresh: bool) -> None:
    """Under ``whole_fresh_prefills`` a prompt from its slot's start that fits one chunk
    but not the budget left waits for the next step, and so do younger ones; a step's
    first prompt, one longer than a chunk and the rest of a split one still split."""
    model = Model()
    model.hold = asyncio.Event()
    async with running(model, budget=8, chunk=6, slots=6, whole_fresh=whole_fresh) as loop:
        held, a, b, c, d = (loop.open(name) for name in ("held", "a", "b", "c", "d"))
        first = loop.submit(held, "p", 1)
        await eventually(lambda: model.steps)
        works = [
            loop.submit(a, "prompt", 5),
            loop.submit(b, "prompt", 4),
            loop.submit(b, "opening", 1),  # b's 5 positions from its start, together
            loop.submit(c, "prompt", 7),  # longer than a chunk: split either way
            loop.submit(d, "prompt", 2),
        ]
        model.hold.set()
        await first
        await asyncio.gather(*works)
        prompts = model.steps[1:]
        # A step's first prompt is never left: three decode rows leave 5 of the budget.
        model.hold = asyncio.Event()
        second = loop.submit(held, "t", 1, decode=True)
        await eventually(lambda: len(model.steps) > len(prompts) + 1)
        e = loop.open("e")
        rows = [loop.submit(r, "t", 1, decode=True) for r in (a, b, c)]
        works = [*rows, loop.submit(e, "prompt", 6)]
        model.hold.set()
        await second
        await asyncio.gather(*works)
    if whole_fresh:
        assert prompts == [
            [("a", 0, 5, False)],  # b's 5 do not fit the 3 left: b, c and d wait
            [("b", 0, 4, False), ("b", 4, 1, False), ("c", 0, 3, False)],
            [("c", 3, 4, False), ("d", 0, 2, False)],
        ]
    else:
        assert prompts == [
            [("a", 0, 5, False), ("b", 0, 3, False)],
            [("b", 3, 1, False), ("b", 4, 1, False), ("c", 0, 6, False)],
            [("c", 6, 1, False), ("d", 0, 2, False)],
        ]
    assert model.steps[-2:] == [
        [("a", 5, 1, True), ("b", 5, 1, True), ("c", 7, 1, True), ("e", 0, 5, False)],
        [("e", 5, 1, False)],
    ]


@pytest.mark.parametrize("ahead", [0, 2])
async def test_a_young_reply_s_decode_rows_run_ahead_of_other_prompts(ahead: int) -> None:
    """With ``decode_ahead``, the first decode rows after a request's prefill do not wait
    for other requests' prompts: a step that would run them beside prompts runs the rows
    alone, then the prompts with the next rows (never two such steps in a row); a reply
    past its first ``decode_ahead`` rows runs beside prompts. Without, rows and prompts
    share every step."""
    model = Model()
    model.hold = asyncio.Event()

    async def release(steps: int) -> None:
        """Let the held step end; hold the next, the ``steps``-th."""
        held, model.hold = model.hold, asyncio.Event()
        held.set()
        await eventually(lambda: len(model.steps) == steps)

    async with running(model, budget=16, chunk=8, slots=6, decode_ahead=ahead) as loop:
        a, b, c, d = (loop.open(name) for name in "abcd")
        works = [loop.submit(a, "prompt", 4)]
        await eventually(lambda: len(model.steps) == 1)
        works += [loop.submit(a, "t", 1, decode=True) for _ in range(3)]
        works += [loop.submit(b, "prompt", 4), loop.submit(c, "prompt", 4)]
        await release(2)
        await release(3)
        works.append(loop.submit(d, "prompt", 4))
        await release(4)
        model.hold.set()
        await asyncio.gather(*works)
        stats = loop.statistics()
    prompts = [("b", 0, 4, False), ("c", 0, 4, False)]
    if ahead:
        assert model.steps[1:] == [
            [("a", 4, 1, True)],  # a's first row, ahead of b's and c's prompts
            [("a", 5, 1, True), *prompts],  # then the prompts, a's next row beside them
            [("a", 6, 1, True), ("d", 0, 4, False)],  # a's third row: past its first two
        ]
        assert stats.ahead_steps == 1
    else:
        assert model.steps[1:] == [
            [("a", 4, 1, True), *prompts],
            [("a", 5, 1, True)],
            [("a", 6, 1, True), ("d", 0, 4, False)],
        ]
        assert stats.ahead_steps == 0
    assert (a.young, b.young, c.young, d.young) == (0, ahead, ahead, ahead)


async def test_an_urgent_prefill_goes_before_older_ones() -> None:
    """An urgent work takes its request's queue (the prefill before it included) ahead of
    other requests' prefills, older ones too, in a step of its own with the decode rows
    (the others' prefills wait for the next, however much budget is left); urgent
    requests among themselves, and the rest, keep oldest first."""
    model = Model()
    model.hold = asyncio.Event()
    async with running(model, budget=8, chunk=8, slots=6) as loop:
        held, a, b, c, d = (loop.open(name) for name in ("held", "a", "b", "c", "d"))
        first = loop.submit(held, "p", 1)
        await eventually(lambda: model.steps)
        works = [
            loop.submit(a, "rows", 6),
            loop.submit(b, "rows", 6),
            loop.submit(c, "rows", 2),
            loop.submit(c, "opening", 2, urgent=True),
            loop.submit(d, "opening", 2, urgent=True),
            loop.submit(held, "t", 1, decode=True),
        ]
        model.hold.set()
        await first
        await asyncio.gather(*works)
    assert model.steps[1] == [
        ("held", 1, 1, True),
        ("c", 0, 2, False),
        ("c", 2, 2, False),
        ("d", 0, 2, False),
    ]
    assert model.steps[2:] == [[("a", 0, 6, False), ("b", 0, 2, False)], [("b", 2, 4, False)]]


async def test_statistics_time_the_steps_and_how_long_work_queued_for_them() -> None:
    """What ``bench pipeline`` reads per level: time in steps (with prefill chunks or
    not), and each prefill's wait before its first chunk and each decode row's before its
    step, on the loop's clock (here advanced 5 s by every step)."""
    now = [0.0]
    model = Model()
    model.hold = asyncio.Event()

    async def timed(chunks: list[Chunk[str, str]]) -> list[str]:
        outputs = await model(chunks)
        now[0] += 5.0
        return outputs

    loop: StepLoop[str, str] = StepLoop(
        timed, slots=4, max_context=64, max_tokens_per_step=8, max_chunk=4, clock=lambda: now[0]
    )
    loop.start()
    try:
        a, b, c = (loop.open(name) for name in "abc")
        first = loop.submit(a, "p", 3)  # step 1 starts at 0: no wait
        await eventually(lambda: model.steps)
        now[0] = 2.0
        later = [loop.submit(b, "prompt", 10), loop.submit(c, "t", 1, decode=True)]
        model.hold.set()
        await first
        await asyncio.gather(*later)  # steps 2-4 from 7: b in three chunks, c in the first
        await loop.submit(a, "t", 1, decode=True)  # step 5, decode alone
        stats = loop.statistics()
    finally:
        await loop.stop()
    assert [len(step) for step in model.steps] == [1, 2, 1, 1, 1]
    assert (stats.steps, stats.prefill_steps, stats.decode_rows) == (5, 4, 2)
    assert (stats.step_s, stats.prefill_step_s) == (27.0, 22.0)  # step 1 ran 0 .. 7
    assert stats.prefill_works == 2  # a and b, once each whatever their chunks
    assert stats.prefill_wait_s == 5.0  # b, queued at 2, first ran at 7
    assert stats.decode_wait_s == 5.0  # c likewise; a's row ran as it was queued


async def test_a_traced_loop_writes_each_step_as_a_json_line_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the trace's directory in the environment, each step is one line (its
    start, time, decode rows and prefill chunks by request), in a file of the loop's own,
    closed when the loop stops; an unusable directory fails the start."""
    monkeypatch.setenv(STEP_TRACE_ENV, str(tmp_path / "steps"))
    model = Model()
    loop: StepLoop[str, str] = StepLoop(
        model, slots=2, max_context=64, max_tokens_per_step=8, max_chunk=4, name="talker steps"
    )
    loop.start()
    a, b = loop.open("a"), loop.open("b")
    await loop.submit(a, "p", 6)
    await asyncio.gather(loop.submit(a, "d", 1, decode=True), loop.submit(b, "q", 3))
    await loop.stop()
    (path,) = (tmp_path / "steps").iterdir()
    assert path.name == f"talker_steps-{os.getpid()}.jsonl"
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(steps) == len(model.steps) == 3
    assert [s["prefill"] for s in steps] == [[["a", 0, 4]], [["a", 4, 2]], [["b", 0, 3]]]
    assert [s["decode"] for s in steps] == [[], [], ["a"]]
    assert all(s["loop"] == "talker steps" and s["ms"] >= 0 for s in steps)
    assert steps[0]["t"] <= steps[1]["t"] <= steps[2]["t"]
    assert loop._trace is None  # closed with the loop

    (tmp_path / "file").write_text("")
    broken: StepLoop[str, str] = StepLoop(
        Model(),
        slots=1,
        max_context=8,
        max_tokens_per_step=8,
        max_chunk=4,
        trace_dir=tmp_path / "file" / "steps",
    )
    with pytest.raises(OSError, match="file"):
        broken.start()
    assert not broken.running


async def test_a_caller_woken_through_a_shield_queues_its_next_work_in_the_next_step() -> None:
    """A session that awaits its prompt through ``asyncio.shield`` (as an engine's
    ``feed`` does, so that its cancel leaves the work running) wakes a turn of the event
    loop after one that awaits the work itself: its first decode row still joins the
    step that follows, beside the work queued meanwhile, not the one after."""
    model = Model()
    model.hold = asyncio.Event()
    async with running(model, budget=8, chunk=8) as loop:
        a, b = loop.open("a"), loop.open("b")

        async def session() -> None:
            await asyncio.shield(loop.submit(a, "prompt", 2))
            await loop.submit(a, "d", 1, decode=True)

        task = asyncio.create_task(session())
        await eventually(lambda: model.steps)  # the prompt's step runs
        later = loop.submit(b, "other", 4)
        model.hold.set()
        await asyncio.gather(task, later)
    assert model.steps == [[("a", 0, 2, False)], [("a", 2, 1, True), ("b", 0, 4, False)]]
