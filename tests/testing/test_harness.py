"""The test harness itself: probes, virtual clock, fixtures, leak detection."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from omni_actors import Actor
from omni_actors.testing import ActorTestKit, TestProbe, VirtualClock


@dataclass
class Hello:
    who: str


class Quiet(Actor[Hello]):
    async def receive(self, message: Hello) -> None:
        return None


async def test_probe_expectations(actor_testkit: ActorTestKit) -> None:
    probe = await actor_testkit.create_probe()
    await probe.ref.tell(Hello("a"))
    await probe.ref.tell(Hello("b"))
    assert (await probe.expect_message(Hello)).who == "a"
    assert await probe.expect_message(Hello("b")) == Hello("b")
    await probe.expect_no_message(0.01)
    await probe.ref.tell(Hello("c"))
    with pytest.raises(AssertionError, match="expected no message, got Hello"):
        await probe.expect_no_message(0.05)
    await probe.ref.tell(Hello("d"))
    with pytest.raises(AssertionError, match="expected <class 'int'>, got Hello"):
        await probe.expect_message(int)
    with pytest.raises(AssertionError, match=r"timed out after 0\.01s"):
        await probe.expect_message(Hello, timeout=0.01)
    for who in "xyz":
        await probe.ref.tell(Hello(who))
    assert [m.who for m in await probe.receive_messages(3)] == ["x", "y", "z"]  # type: ignore[attr-defined]


async def test_expect_terminated(actor_testkit: ActorTestKit) -> None:
    probe: TestProbe = await actor_testkit.create_probe()
    ref = await actor_testkit.spawn(Quiet)
    other = await actor_testkit.spawn(Quiet)
    stop = asyncio.ensure_future(actor_testkit.system.stop(ref))
    terminated = await probe.expect_terminated(ref)
    await stop
    assert terminated.reason is None
    await actor_testkit.system.stop(other)
    probe.watch(other)
    with pytest.raises(AssertionError, match="expected Terminated"):
        await probe.expect_terminated(ref)


async def test_virtual_testkit_fixture(virtual_testkit: ActorTestKit) -> None:
    assert virtual_testkit.virtual_clock.now() == 0.0


def test_virtual_clock_runs_timers_in_deadline_order() -> None:
    clock = VirtualClock()
    fired: list[str] = []
    clock.call_later(2.0, lambda: fired.append("b"))
    clock.call_later(1.0, lambda: fired.append("a"))
    cancelled = clock.call_later(1.5, lambda: fired.append("never"))
    cancelled.cancel()
    assert clock.pending() == [1.0, 2.0]
    assert clock.advance(1.0) == 1
    assert fired == ["a"]
    assert clock.now() == 1.0
    clock.advance(5.0)
    assert fired == ["a", "b"]
    assert clock.pending() == []
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)


async def test_virtual_time_is_only_for_virtual_kits() -> None:
    async with ActorTestKit() as kit:
        with pytest.raises(RuntimeError, match="virtual_time=True"):
            _ = kit.virtual_clock


class Stubborn(Actor[Hello]):
    """Swallows cancellation a few times: a stand-in for a misbehaving engine call."""

    async def receive(self, message: Hello) -> None:
        for _ in range(3):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue


async def test_testkit_reports_actor_tasks_that_survive_shutdown() -> None:
    kit = ActorTestKit(stop_timeout=0.02)
    await kit.__aenter__()
    ref = await kit.spawn(Stubborn)
    await ref.tell(Hello("x"))
    await asyncio.sleep(0)
    with pytest.raises(AssertionError, match="still running after shutdown"):
        await kit.shutdown()
    task = ref._cell.task
    assert task is not None
    while not task.done():  # finish what the test deliberately leaked
        task.cancel()
        await asyncio.sleep(0)
