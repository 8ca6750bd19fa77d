"""``StepBatcher``: the pending steps of many sessions share one call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from omni_actors.actors.engines.step_batcher import BatcherStoppedError, StepBatcher
from omni_actors.testing import eventually


class FakeModel:
    """Records each call's steps; a step's result is its value times ten. A call can be
    held (to let steps queue behind it) or made to fail."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[list[int]] = []
        self.fail_on = fail_on
        self.hold: asyncio.Event | None = None

    async def __call__(self, steps: list[int]) -> list[int]:
        self.calls.append(list(steps))
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_on in steps:
            raise RuntimeError("forward failed")
        return [step * 10 for step in steps]


@contextlib.asynccontextmanager
async def running(model: FakeModel, max_batch: int = 16) -> AsyncIterator[StepBatcher[int, int]]:
    batcher: StepBatcher[int, int] = StepBatcher(model, max_batch=max_batch)
    batcher.start()
    try:
        yield batcher
    finally:
        await batcher.stop()


async def results(futures: list[asyncio.Future[int]]) -> list[int]:
    return await asyncio.wait_for(asyncio.gather(*futures), 2.0)


async def test_pending_steps_share_a_call_and_each_gets_its_result() -> None:
    model = FakeModel()
    async with running(model) as batcher:
        assert await results([batcher.submit(step) for step in range(4)]) == [0, 10, 20, 30]
        assert (batcher.calls, batcher.steps, batcher.largest) == (1, 4, 4)
    assert model.calls == [[0, 1, 2, 3]]


async def test_steps_submitted_during_a_call_join_the_next_one() -> None:
    model = FakeModel()
    model.hold = asyncio.Event()
    async with running(model) as batcher:
        first = batcher.submit(0)
        await eventually(lambda: len(model.calls) == 1)
        later = [batcher.submit(step) for step in (1, 2, 3)]
        model.hold.set()
        assert await results([first, *later]) == [0, 10, 20, 30]
    assert model.calls == [[0], [1, 2, 3]]


async def sessions(batcher: StepBatcher[int, int], count: int, steps: int) -> list[list[int]]:
    """``count`` sessions stepping ``steps`` times each, each resubmitting as soon as its
    result comes (as an engine's ``generate`` does)."""

    async def session(tag: int) -> list[int]:
        return [await batcher.submit(tag) for _ in range(steps)]

    return await asyncio.wait_for(asyncio.gather(*(session(t) for t in range(count))), 2.0)


async def test_sessions_answered_by_a_call_step_again_together() -> None:
    """Sessions that queued during a call and those it answered merge into one call,
    instead of alternating in two halves."""
    model = FakeModel()
    model.hold = asyncio.Event()
    async with running(model) as batcher:
        early = asyncio.ensure_future(sessions(batcher, 2, steps=4))
        await eventually(lambda: len(model.calls) == 1)  # sessions 0 and 1, held
        late = [batcher.submit(tag) for tag in (7, 8)]  # queue during that call
        model.hold.set()
        await results(late)
        await early
    # Without the batcher's loop turn: [0, 1], [7, 8], then [0, 1] three times.
    assert model.calls == [[0, 1], [7, 8, 0, 1], [0, 1], [0, 1]]


async def test_a_call_takes_at_most_max_batch_steps_oldest_first() -> None:
    model = FakeModel()
    async with running(model, max_batch=2) as batcher:
        await results([batcher.submit(step) for step in range(5)])
        assert batcher.largest == 2
    assert model.calls == [[0, 1], [2, 3], [4]]


async def test_a_withdrawn_step_is_never_run() -> None:
    model = FakeModel()
    async with running(model) as batcher:
        futures = [batcher.submit(step) for step in range(3)]
        futures[1].cancel()  # its session ended before the batcher ran
        assert await results([futures[0], futures[2]]) == [0, 20]
    assert model.calls == [[0, 2]]


async def test_a_failed_call_fails_its_steps_and_the_batcher_goes_on() -> None:
    model = FakeModel(fail_on=1)
    model.hold = asyncio.Event()
    async with running(model) as batcher:
        held = batcher.submit(5)
        await eventually(lambda: len(model.calls) == 1)
        failing = [batcher.submit(step) for step in (1, 2)]
        model.hold.set()
        assert await results([held]) == [50]
        for future in failing:
            with pytest.raises(RuntimeError, match="forward failed"):
                await asyncio.wait_for(future, 2.0)
        assert await results([batcher.submit(3)]) == [30]
    assert model.calls == [[5], [1, 2], [3]]


async def test_stop_runs_what_is_queued_then_refuses_new_steps() -> None:
    model = FakeModel()
    model.hold = asyncio.Event()
    batcher: StepBatcher[int, int] = StepBatcher(model, max_batch=16)
    batcher.start()
    first = batcher.submit(0)
    await eventually(lambda: len(model.calls) == 1)
    queued = batcher.submit(1)
    stopping = asyncio.ensure_future(batcher.stop())
    await eventually(lambda: not batcher.running)
    late = batcher.submit(2)
    with pytest.raises(BatcherStoppedError, match="not running"):
        await late
    model.hold.set()
    await asyncio.wait_for(stopping, 2.0)
    assert await results([first, queued]) == [0, 10]
    assert model.calls == [[0], [1]]


async def test_stop_cancelled_mid_call_fails_the_steps_left() -> None:
    model = FakeModel()
    model.hold = asyncio.Event()  # never set: the call hangs
    batcher: StepBatcher[int, int] = StepBatcher(model, max_batch=1)
    batcher.start()
    futures = [batcher.submit(step) for step in range(2)]
    await eventually(lambda: len(model.calls) == 1)
    stopping = asyncio.ensure_future(batcher.stop())
    await eventually(lambda: not batcher.running)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    for future in futures:
        with pytest.raises(BatcherStoppedError):
            await asyncio.wait_for(future, 2.0)
    assert model.calls == [[0]]


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        StepBatcher(FakeModel(), max_batch=0)
