"""The test harness itself: probes, fault injection, virtual clock, test kit, fixtures."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from omni_actors import Actor, Backoff, Props, SupervisorStrategy, Terminated
from omni_actors.testing import (
    ActorTestKit,
    InjectedFault,
    TestProbe,
    VirtualClock,
    crash_after,
    eventually,
)
from omni_actors.testing.inspection import actor_task, watched_by

pytest_plugins = ["pytester"]


@dataclass
class Hello:
    who: str


class Quiet(Actor[Hello]):
    async def receive(self, message: Hello) -> None:
        return None


class Echo(Actor[int]):
    async def receive(self, message: int) -> int:
        return message


class Boom(Exception):
    pass


# Restarts at once and never gives up: crash_after tests count messages, not time.
INSTANT_RESTARTS = SupervisorStrategy(max_restarts=100, backoff=Backoff(min_s=0, max_s=0))


# -- TestProbe -------------------------------------------------------------------------


async def test_expect_message_by_type_and_by_value(actor_testkit: ActorTestKit) -> None:
    probe = await actor_testkit.create_probe()
    await probe.ref.tell(Hello("a"))
    await probe.ref.tell(Hello("b"))
    got = await probe.expect_message(Hello)
    assert got == Hello("a")
    assert await probe.expect_message(Hello("b")) == Hello("b")
    await probe.ref.tell(3)
    assert await probe.expect_message(int) == 3


async def test_failed_expectations_say_what_was_expected_and_got(
    actor_testkit: ActorTestKit,
) -> None:
    probe = await actor_testkit.create_probe(name="p")
    await probe.ref.tell(Hello("a"))
    with pytest.raises(AssertionError, match=r"/p: expected <class 'int'>, got Hello\(who='a'\)"):
        await probe.expect_message(int)
    await probe.ref.tell(Hello("a"))
    with pytest.raises(AssertionError, match=r"expected Hello\(who='b'\), got Hello\(who='a'\)"):
        await probe.expect_message(Hello("b"))
    with pytest.raises(
        AssertionError, match=r"probe /p: timed out after 0\.01s waiting for <class '.*Hello'>"
    ):
        await probe.expect_message(Hello, timeout=0.01)


async def test_expect_no_message(actor_testkit: ActorTestKit) -> None:
    probe = await actor_testkit.create_probe(name="p")
    await probe.expect_no_message(0.01)
    await probe.ref.tell(Hello("late"))
    with pytest.raises(
        AssertionError, match=r"probe /p: expected no message, got Hello\(who='late'\)"
    ):
        await probe.expect_no_message(0.05)


async def test_receive_messages_in_order(actor_testkit: ActorTestKit) -> None:
    probe = await actor_testkit.create_probe(name="p")
    for who in "xyz":
        await probe.ref.tell(Hello(who))
    assert await probe.receive_messages(3) == [Hello("x"), Hello("y"), Hello("z")]
    assert await probe.receive_messages(0) == []
    await probe.ref.tell(Hello("only"))
    with pytest.raises(AssertionError, match="waiting for message 2 of 2"):
        await probe.receive_messages(2, timeout=0.01)


async def test_expect_terminated(actor_testkit: ActorTestKit) -> None:
    probe: TestProbe = await actor_testkit.create_probe()
    ref = await actor_testkit.spawn(Quiet)
    stopping = asyncio.create_task(actor_testkit.system.stop(ref))
    terminated = await probe.expect_terminated(ref)
    await stopping
    assert terminated == Terminated(ref, None)
    # An actor that was already gone when the probe started watching is reported too.
    gone = await actor_testkit.spawn(Quiet)
    await actor_testkit.system.stop(gone)
    assert await probe.expect_terminated(gone) == Terminated(gone, None)
    failing = await actor_testkit.spawn(crash_after(Echo, 0, error=Boom))
    with pytest.raises(Boom):
        await failing.ask(1)
    assert isinstance((await probe.expect_terminated(failing)).reason, Boom)


async def test_expect_terminated_of_the_wrong_actor_fails(actor_testkit: ActorTestKit) -> None:
    probe = await actor_testkit.create_probe()
    ref = await actor_testkit.spawn(Quiet, name="watched")
    other = await actor_testkit.spawn(Quiet, name="other")
    probe.watch(other)
    await actor_testkit.system.stop(other)
    with pytest.raises(AssertionError, match=r"expected Terminated\(/watched\), got Terminated"):
        await probe.expect_terminated(ref)
    with pytest.raises(AssertionError, match=r"timed out .* Terminated\(/watched\)"):
        await probe.expect_terminated(ref, timeout=0.01)


async def test_a_watcher_forgets_an_actor_once_it_has_terminated(
    actor_testkit: ActorTestKit,
) -> None:
    probe = await actor_testkit.create_probe()
    ref = await actor_testkit.spawn(Quiet)
    probe.watch(ref)
    await actor_testkit.system.stop(ref)
    await probe.expect_terminated(ref)
    assert watched_by(probe.ref) == []


# -- crash_after -----------------------------------------------------------------------


async def asks(ref: Any, count: int) -> list[object]:
    """Ask ``count`` times; each outcome is the reply or the exception type."""
    outcomes: list[object] = []
    for n in range(count):
        try:
            outcomes.append(await ref.ask(n))
        except Exception as exc:
            outcomes.append(type(exc))
    return outcomes


async def test_crash_after_crashes_once_after_n_messages() -> None:
    faulty = crash_after(Echo, 2)
    assert issubclass(faulty, Echo)
    assert faulty.__name__ == "FaultyEcho"
    async with ActorTestKit(strategy=INSTANT_RESTARTS) as kit:
        ref = await kit.spawn(faulty, props=Props(restart="permanent"))
        assert await asks(ref, 2) == [0, 1]
        with pytest.raises(InjectedFault, match="injected fault in FaultyEcho after 2"):
            await ref.ask(2)
        assert await asks(ref, 6) == [0, 1, 2, 3, 4, 5]  # times=1: no more crashes


async def test_crash_after_counts_per_instance_up_to_times() -> None:
    async with ActorTestKit(strategy=INSTANT_RESTARTS) as kit:
        twice = await kit.spawn(crash_after(Echo, 1, times=2), props=Props(restart="permanent"))
        assert await asks(twice, 6) == [0, InjectedFault, 2, InjectedFault, 4, 5]
        always = await kit.spawn(crash_after(Echo, 1, times=None), props=Props(restart="permanent"))
        assert await asks(always, 6) == [0, InjectedFault, 2, InjectedFault, 4, InjectedFault]
        first = await kit.spawn(crash_after(Echo, 0, error=Boom), props=Props(restart="permanent"))
        assert await asks(first, 3) == [Boom, 1, 2]
    with pytest.raises(ValueError, match="messages must be >= 0"):
        crash_after(Echo, -1)


# -- VirtualClock ----------------------------------------------------------------------


def test_virtual_clock_runs_due_timers_in_deadline_order() -> None:
    clock = VirtualClock(start=10.0)
    fired: list[tuple[str, float]] = []

    def at(label: str) -> Any:
        return lambda: fired.append((label, clock.now()))

    clock.call_later(2.0, at("b"))
    clock.call_later(1.0, at("a1"))
    clock.call_later(1.0, at("a2"))  # same deadline: scheduling order
    clock.call_later(-3.0, at("now"))  # negative delays mean "now"
    assert clock.pending() == [0.0, 1.0, 1.0, 2.0]
    assert clock.advance(0) == 1
    assert clock.advance(1.0) == 2
    assert fired == [("now", 10.0), ("a1", 11.0), ("a2", 11.0)]
    assert clock.now() == 11.0
    assert clock.pending() == [1.0]  # delays are relative to now
    assert clock.advance(5.0) == 1
    assert fired[-1] == ("b", 12.0)
    assert clock.now() == 16.0
    assert clock.pending() == []


def test_virtual_clock_cancel_and_timers_scheduled_while_advancing() -> None:
    clock = VirtualClock()
    fired: list[str] = []
    cancelled = clock.call_later(1.5, lambda: fired.append("never"))

    def chain(delay: float, label: str) -> None:
        clock.call_later(delay, lambda: fired.append(label))

    clock.call_later(1.0, lambda: chain(0.5, "chained"))
    clock.call_later(1.0, lambda: chain(5.0, "later"))
    cancelled.cancel()
    assert clock.pending() == [1.0, 1.0]
    assert clock.advance(2.0) == 3  # the chained timer was due within the same advance
    assert fired == ["chained"]
    assert clock.pending() == [4.0]
    cancelled.cancel()  # cancelling twice, or after it was due, is harmless
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)


async def test_virtual_clock_drives_restart_backoff(virtual_testkit: ActorTestKit) -> None:
    clock = virtual_testkit.virtual_clock
    ref = await virtual_testkit.spawn(crash_after(Echo, 0), props=Props(restart="permanent"))
    with pytest.raises(InjectedFault):
        await ref.ask(1)
    # the supervisor schedules the restart on its own task
    [delay] = await virtual_testkit.eventually(clock.pending)
    assert 0.01 <= delay <= 0.011  # Backoff() default: 10 ms plus up to 10 % jitter
    waiting = asyncio.create_task(ref.ask(2))
    # real time passes, virtual time does not
    await virtual_testkit.consistently(lambda: not waiting.done())
    clock.advance(delay)
    assert await asyncio.wait_for(waiting, 1) == 2


# -- ActorTestKit and the fixtures -------------------------------------------------------


async def test_testkit_shuts_down_clean() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Echo, name="echo")
        probe = await kit.create_probe(name="probe")
        assert probe.ref.path == "/probe"
        assert await ref.ask(5) == 5
    assert kit.system.is_terminated
    assert not ref.is_alive
    assert kit.live_tasks() == []


async def test_virtual_clock_is_only_for_virtual_kits() -> None:
    async with ActorTestKit() as kit:
        assert kit.clock is None
        with pytest.raises(RuntimeError, match="virtual_time=True"):
            _ = kit.virtual_clock


class Stubborn(Actor[Hello]):
    """Swallows cancellation a few times: a stand-in for a misbehaving engine call."""

    def __init__(self, entered: asyncio.Event) -> None:
        self.entered = entered

    async def receive(self, message: Hello) -> None:
        self.entered.set()
        for _ in range(3):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                continue


async def test_testkit_reports_actor_tasks_that_survive_shutdown() -> None:
    entered = asyncio.Event()
    kit = ActorTestKit(stop_timeout=0.02)
    await kit.__aenter__()
    ref = await kit.spawn(Stubborn, entered, name="stubborn")
    await ref.tell(Hello("x"))
    await entered.wait()
    with pytest.raises(AssertionError, match=r"running after shutdown: \['actor /stubborn'\]"):
        await kit.shutdown()
    task = actor_task(ref)
    assert task is not None

    def cancelled_for_good() -> bool:  # finish what the test deliberately leaked
        task.cancel()
        return task.done()

    await eventually(cancelled_for_good)


async def test_actor_testkit_fixture(actor_testkit: ActorTestKit) -> None:
    assert actor_testkit.clock is None
    assert await (await actor_testkit.spawn(Echo)).ask(7) == 7


async def test_virtual_testkit_fixture(virtual_testkit: ActorTestKit) -> None:
    assert virtual_testkit.system.clock is virtual_testkit.virtual_clock
    assert virtual_testkit.virtual_clock.now() == 0.0


def test_fixtures_come_from_the_installed_plugin(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(
        """
        from omni_actors import Actor

        class Echo(Actor[int]):
            async def receive(self, message: int) -> int:
                return message

        async def test_real(actor_testkit):
            assert await (await actor_testkit.spawn(Echo)).ask(1) == 1

        async def test_virtual(virtual_testkit):
            virtual_testkit.virtual_clock.advance(1.0)
            assert virtual_testkit.system.clock.now() == 1.0
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


async def test_worker_pid_refuses_a_local_actor() -> None:
    from omni_actors.testing import kill_worker, worker_pid

    async with ActorTestKit() as kit:
        ref = await kit.spawn(Echo, name="local")
        with pytest.raises(ValueError, match="not a process actor"):
            worker_pid(ref)
        with pytest.raises(ValueError, match="not a process actor"):
            kill_worker(ref)
