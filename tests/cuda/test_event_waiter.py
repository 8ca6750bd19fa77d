"""``EventWaiter``: futures resolve when their events complete, in order, without the
event loop blocking; failures stay with their event; closing fails what is pending.

The events here are stand-ins that complete when the test says so (a ``threading.Event``
plays the device); ``torch.cuda.Event`` offers the same ``synchronize`` and ``query``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from omni_actors.cuda import EventWaiter, EventWaiterClosedError
from omni_actors.testing import eventually


class DeviceEvent:
    """Completes when :meth:`complete` is called (or fails with ``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        self._done = threading.Event()
        self.error = error
        self.waited = threading.Event()

    def complete(self) -> None:
        self._done.set()

    def query(self) -> bool:
        if self.error is not None and self._done.is_set():
            raise self.error
        return self._done.is_set()

    def synchronize(self) -> None:
        self.waited.set()
        if not self._done.wait(timeout=30):
            raise TimeoutError("the test never completed this event")
        if self.error is not None:
            raise self.error


async def test_a_future_resolves_once_its_event_completes_and_the_loop_runs_meanwhile() -> None:
    waiter = EventWaiter()
    event = DeviceEvent()
    future = waiter.wait(event)
    await eventually(event.waited.is_set)  # the thread blocks on it; the loop runs this
    assert not future.done()
    event.complete()
    await asyncio.wait_for(future, 5)
    assert waiter.pending == 0
    await waiter.close()


async def test_events_resolve_in_submission_order() -> None:
    waiter = EventWaiter()
    events = [DeviceEvent() for _ in range(5)]
    futures = [waiter.wait(e) for e in events]
    order: list[int] = []

    def record(index: int) -> Callable[[object], None]:
        return lambda _: order.append(index)

    for i, future in enumerate(futures):
        future.add_done_callback(record(i))
    for event in reversed(events):  # the device finishes them all; the waiter keeps order
        event.complete()
    await asyncio.wait_for(asyncio.gather(*futures), 5)
    assert order == [0, 1, 2, 3, 4]
    await waiter.close()


async def test_a_failed_event_fails_only_its_future() -> None:
    waiter = EventWaiter()
    bad, good = DeviceEvent(RuntimeError("CUDA error: an illegal memory access")), DeviceEvent()
    failed, ok = waiter.wait(bad), waiter.wait(good)
    bad.complete()
    good.complete()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        await asyncio.wait_for(failed, 5)
    await asyncio.wait_for(ok, 5)
    await waiter.close()


async def test_a_cancelled_wait_leaves_the_others_alone() -> None:
    waiter = EventWaiter()
    first, second = DeviceEvent(), DeviceEvent()
    dropped, kept = waiter.wait(first), waiter.wait(second)
    dropped.cancel()
    first.complete()
    second.complete()
    await asyncio.wait_for(kept, 5)
    assert waiter.pending == 0
    await waiter.close()


async def test_close_fails_pending_futures_ends_the_thread_and_refuses_new_waits() -> None:
    waiter = EventWaiter(name="test waiter")
    event = DeviceEvent()
    future = waiter.wait(event)
    await eventually(event.waited.is_set)
    closing = asyncio.ensure_future(waiter.close(timeout=10))
    with pytest.raises(EventWaiterClosedError):
        await asyncio.wait_for(future, 5)
    event.complete()  # the device finishes: the thread sees the end and exits
    await asyncio.wait_for(closing, 15)
    assert not any(t.name == "test waiter" for t in threading.enumerate())
    with pytest.raises(EventWaiterClosedError):
        waiter.wait(DeviceEvent())
    await waiter.close()  # twice is fine


async def test_close_does_not_hang_on_an_event_that_never_completes() -> None:
    waiter = EventWaiter(name="stuck waiter")
    event = DeviceEvent()
    future = waiter.wait(event)
    await eventually(event.waited.is_set)
    await asyncio.wait_for(waiter.close(timeout=0.05), 5)  # returns; the thread is left
    assert future.done()
    event.complete()  # let the left-behind thread end, so the test leaves nothing running

    await eventually(lambda: not any(t.name == "stuck waiter" for t in threading.enumerate()))


async def test_a_waiter_never_used_starts_no_thread() -> None:
    before = threading.active_count()
    waiter = EventWaiter()
    await waiter.close()
    assert threading.active_count() == before


async def test_an_event_complete_already_resolves_at_once_without_the_thread() -> None:
    before = threading.active_count()
    waiter = EventWaiter()
    event = DeviceEvent()
    event.complete()
    future = waiter.wait(event)
    assert future.done()
    assert future.result() is None
    assert not event.waited.is_set()  # never handed to the thread
    assert threading.active_count() == before
    await waiter.close()


async def test_an_event_complete_already_still_waits_behind_an_earlier_pending_one() -> None:
    waiter = EventWaiter()
    earlier, later = DeviceEvent(), DeviceEvent()
    first = waiter.wait(earlier)
    later.complete()
    second = waiter.wait(later)
    assert not second.done()  # resolving it now would overtake ``first``
    order: list[str] = []
    first.add_done_callback(lambda _: order.append("earlier"))
    second.add_done_callback(lambda _: order.append("later"))
    earlier.complete()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert order == ["earlier", "later"]
    await waiter.close()


async def test_a_failed_event_complete_already_fails_through_the_thread() -> None:
    waiter = EventWaiter()
    bad = DeviceEvent(RuntimeError("CUDA error: an illegal memory access"))
    bad.complete()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        await asyncio.wait_for(waiter.wait(bad), 5)
    await waiter.close()
