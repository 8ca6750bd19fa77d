"""``Batcher``: the pending requests of many sessions share one call, by a grouping rule.

The guarantees every rule keeps run under both rules: *step batches* (the thinker's and
talker's decode steps) and *equal-key windows* (code2wav's windows, by length). Here a
request is an int and, for the window rule, its number of digits stands for a window's
length; its result is the int times ten.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable

import pytest

from omni_actors.actors.engines.batcher import Batcher, BatcherStoppedError
from omni_actors.testing import consistently, eventually

Rule = Callable[[int], Hashable] | None


def digits(request: int) -> int:
    """The window rule's key: requests of as many digits share a call."""
    return len(str(request))


RULES = pytest.mark.parametrize("group_by", [None, digits], ids=["steps", "windows"])


class FakeModel:
    """Records each call's requests; a result is the request times ten. A call can be
    held (to let requests queue behind it) or made to fail."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[list[int]] = []
        self.fail_on = fail_on
        self.hold: asyncio.Event | None = None

    async def __call__(self, requests: list[int]) -> list[int]:
        self.calls.append(list(requests))
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_on in requests:
            raise RuntimeError("forward failed")
        return [request * 10 for request in requests]


@contextlib.asynccontextmanager
async def running(
    model: FakeModel, group_by: Rule = None, max_batch: int = 16, wait_s: float = 0.0
) -> AsyncIterator[Batcher[int, int]]:
    batcher: Batcher[int, int] = Batcher(
        model, max_batch=max_batch, group_by=group_by, wait_s=wait_s
    )
    batcher.start()
    try:
        yield batcher
    finally:
        await batcher.stop()


async def results(futures: list[asyncio.Future[int]]) -> list[int]:
    return await asyncio.wait_for(asyncio.gather(*futures), 2.0)


# -- the grouping rules ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("group_by", "calls"),
    [
        (None, [[7, 42, 9, 100, 13]]),  # steps: every live request, whatever its shape
        (digits, [[7, 9], [42, 13], [100]]),  # windows: the oldest and those of its length
    ],
    ids=["steps", "windows"],
)
async def test_the_grouping_rule_decides_which_requests_share_a_call(
    group_by: Rule, calls: list[list[int]]
) -> None:
    model = FakeModel()
    async with running(model, group_by) as batcher:
        requests = [7, 42, 9, 100, 13]
        assert await results([batcher.submit(r) for r in requests]) == [r * 10 for r in requests]
    assert model.calls == calls


async def test_windows_fill_a_call_up_to_max_batch_and_the_rest_keep_their_order() -> None:
    model = FakeModel()
    async with running(model, digits, max_batch=2) as batcher:
        await results([batcher.submit(r) for r in (1, 22, 3, 4, 55, 66)])
    assert model.calls == [[1, 3], [22, 55], [4], [66]]


async def test_an_idle_batcher_gathers_for_wait_s_before_its_first_call() -> None:
    model = FakeModel()
    async with running(model, wait_s=0.5) as batcher:
        first = batcher.submit(1)
        await consistently(lambda: model.calls == [], duration=0.05)
        assert await results([first, batcher.submit(2)]) == [10, 20]
    assert model.calls == [[1, 2]]


# -- what every rule guarantees ----------------------------------------------------------


@RULES
async def test_pending_requests_share_a_call_and_each_gets_its_result(group_by: Rule) -> None:
    model = FakeModel()
    async with running(model, group_by) as batcher:
        assert await results([batcher.submit(r) for r in range(4)]) == [0, 10, 20, 30]
        assert (batcher.calls, batcher.requests, batcher.largest) == (1, 4, 4)
    assert model.calls == [[0, 1, 2, 3]]


@RULES
async def test_requests_submitted_during_a_call_join_the_next_one(group_by: Rule) -> None:
    model = FakeModel()
    model.hold = asyncio.Event()
    async with running(model, group_by) as batcher:
        first = batcher.submit(0)
        await eventually(lambda: len(model.calls) == 1)
        later = [batcher.submit(r) for r in (1, 2, 3)]
        model.hold.set()
        assert await results([first, *later]) == [0, 10, 20, 30]
    assert model.calls == [[0], [1, 2, 3]]


async def sessions(batcher: Batcher[int, int], count: int, steps: int) -> list[list[int]]:
    """``count`` sessions submitting ``steps`` times each, each resubmitting as soon as
    its result comes (as an engine's ``generate`` does)."""

    async def session(tag: int) -> list[int]:
        return [await batcher.submit(tag) for _ in range(steps)]

    return await asyncio.wait_for(asyncio.gather(*(session(t) for t in range(count))), 2.0)


@RULES
async def test_sessions_answered_by_a_call_submit_again_together(group_by: Rule) -> None:
    """Sessions that queued during a call and those it answered merge into one call,
    instead of alternating in two halves."""
    model = FakeModel()
    model.hold = asyncio.Event()
    async with running(model, group_by) as batcher:
        early = asyncio.ensure_future(sessions(batcher, 2, steps=4))
        await eventually(lambda: len(model.calls) == 1)  # sessions 0 and 1, held
        late = [batcher.submit(tag) for tag in (7, 8)]  # queue during that call
        model.hold.set()
        await results(late)
        await early
    # Without the batcher's loop turn: [0, 1], [7, 8], then [0, 1] three times.
    assert model.calls == [[0, 1], [7, 8, 0, 1], [0, 1], [0, 1]]


@RULES
async def test_a_call_takes_at_most_max_batch_requests_oldest_first(group_by: Rule) -> None:
    model = FakeModel()
    async with running(model, group_by, max_batch=2) as batcher:
        await results([batcher.submit(r) for r in range(5)])
        assert batcher.largest == 2
    assert model.calls == [[0, 1], [2, 3], [4]]


@RULES
async def test_a_withdrawn_request_is_never_run(group_by: Rule) -> None:
    model = FakeModel()
    async with running(model, group_by) as batcher:
        futures = [batcher.submit(r) for r in range(3)]
        futures[1].cancel()  # its session ended before the batcher ran
        assert await results([futures[0], futures[2]]) == [0, 20]
    assert model.calls == [[0, 2]]


@RULES
async def test_a_row_withdrawn_during_its_call_is_dropped_and_the_others_answered(
    group_by: Rule,
) -> None:
    model = FakeModel()
    model.hold = asyncio.Event()
    async with running(model, group_by) as batcher:
        futures = [batcher.submit(r) for r in range(3)]
        await eventually(lambda: len(model.calls) == 1)
        futures[1].cancel()  # its session was aborted while the call ran
        model.hold.set()
        assert await results([futures[0], futures[2]]) == [0, 20]
    assert futures[1].cancelled()
    assert model.calls == [[0, 1, 2]]


@RULES
async def test_a_failed_call_fails_its_requests_and_the_batcher_goes_on(group_by: Rule) -> None:
    model = FakeModel(fail_on=1)
    model.hold = asyncio.Event()
    async with running(model, group_by) as batcher:
        held = batcher.submit(5)
        await eventually(lambda: len(model.calls) == 1)
        failing = [batcher.submit(r) for r in (1, 2)]
        model.hold.set()
        assert await results([held]) == [50]
        for future in failing:
            with pytest.raises(RuntimeError, match="forward failed"):
                await asyncio.wait_for(future, 2.0)
        assert await results([batcher.submit(3)]) == [30]
    assert model.calls == [[5], [1, 2], [3]]


@RULES
async def test_stop_runs_what_is_queued_then_refuses_new_requests(group_by: Rule) -> None:
    model = FakeModel()
    model.hold = asyncio.Event()
    batcher: Batcher[int, int] = Batcher(model, max_batch=16, group_by=group_by)
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


async def test_stop_cancelled_mid_call_fails_the_requests_left() -> None:
    model = FakeModel()
    model.hold = asyncio.Event()  # never set: the call hangs
    batcher: Batcher[int, int] = Batcher(model, max_batch=1)
    batcher.start()
    futures = [batcher.submit(r) for r in range(2)]
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


def test_max_batch_and_wait_s_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        Batcher(FakeModel(), max_batch=0)
    with pytest.raises(ValueError, match="wait_s must be >= 0"):
        Batcher(FakeModel(), max_batch=1, wait_s=-1.0)
