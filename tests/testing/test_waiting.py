"""``eventually``/``consistently``, the kit's views, and deadlines on a virtual clock."""

from __future__ import annotations

import asyncio

import pytest

from omni_actors import Actor
from omni_actors.clock import LoopClock, timeout_at
from omni_actors.testing import ActorTestKit, VirtualClock, consistently, eventually


async def test_eventually_returns_the_first_truthy_value() -> None:
    calls = 0

    def ready() -> int:
        nonlocal calls
        calls += 1
        return calls if calls >= 3 else 0

    assert await eventually(ready) == 3


async def test_eventually_takes_async_conditions_and_assertions() -> None:
    seen: list[int] = []

    async def grows() -> None:
        seen.append(1)
        assert len(seen) >= 2, "not yet"

    await eventually(grows)
    assert len(seen) == 2


async def test_eventually_fails_with_the_last_reason() -> None:
    def never() -> None:
        raise AssertionError("the stage still holds s")

    with pytest.raises(AssertionError, match=r"within 0\.05s: never: the stage still holds s"):
        await eventually(never, timeout=0.05)
    with pytest.raises(AssertionError, match=r"the flag \(last: 0\)"):
        await eventually(lambda: 0, timeout=0.02, what="the flag")


async def test_consistently_fails_as_soon_as_the_condition_breaks() -> None:
    flag = [True]
    asyncio.get_running_loop().call_soon(flag.clear)
    with pytest.raises(AssertionError, match="stopped being true"):
        await consistently(lambda: bool(flag), duration=5.0)
    await consistently(lambda: True, duration=0.01)


class Holder(Actor[int]):
    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate

    async def receive(self, message: int) -> None:
        await self.gate.wait()


async def test_the_kit_shows_mailboxes_instances_and_liveness() -> None:
    gate = asyncio.Event()
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Holder, gate, name="holder")
        instance = kit.instance(ref)
        assert isinstance(instance, Holder)
        assert kit.is_alive("/holder")
        assert kit.is_alive(ref)
        assert "/holder" in kit.live_actors()
        for n in range(3):
            await ref.tell(n)
        # the first is being received; two wait in the mailbox
        await kit.eventually(lambda: kit.queued_messages(ref) == [1, 2])
        assert kit.mailbox_depth(ref) == 2
        assert kit.mailbox_room(ref) == ref_capacity(kit, ref) - 2
        gate.set()
        await kit.eventually(lambda: kit.mailbox_depth(ref) == 0)
        await kit.system.stop(ref)
        assert await kit.terminated(ref) is None
        assert not kit.is_alive("/holder")
        assert kit.instance(ref) is None


def ref_capacity(kit: ActorTestKit, ref: object) -> int:
    return Holder.mailbox.capacity


async def test_a_deadline_on_a_virtual_clock_fires_only_when_time_is_advanced() -> None:
    clock = VirtualClock()

    async def wait_forever() -> None:
        async with timeout_at(clock, 2.0):
            await asyncio.Event().wait()

    waiting = asyncio.ensure_future(wait_forever())
    await eventually(lambda: clock.pending() == [2.0], what="the deadline's timer")
    clock.advance(1.9)
    await consistently(lambda: not waiting.done(), duration=0.02)
    clock.advance(0.1)
    with pytest.raises(TimeoutError):
        await waiting


async def test_a_deadline_already_passed_fires_at_once() -> None:
    clock = VirtualClock(start=10.0)
    with pytest.raises(TimeoutError):
        async with timeout_at(clock, 5.0):
            await asyncio.Event().wait()


async def test_a_timeout_lets_an_outer_cancellation_through() -> None:
    started = asyncio.Event()

    async def guarded() -> None:
        async with timeout_at(LoopClock(), asyncio.get_running_loop().time() + 60):
            started.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(guarded())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
