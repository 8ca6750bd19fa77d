"""Supervision: strategies, restart types, intensity, backoff, stash, watch."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from omni_actors import (
    Actor,
    ActorRef,
    ActorStoppedError,
    Backoff,
    MailboxConfig,
    RestartIntensityExceededError,
    SupervisorStrategy,
    Terminated,
)
from omni_actors.testing import ActorTestKit, InjectedFault, crash_after

NO_BACKOFF = Backoff(min_s=0.0, max_s=0.0, jitter=0.0)


@dataclass
class Add:
    n: int


@dataclass
class Get:
    pass


@dataclass
class Boom:
    error: Exception = field(default_factory=lambda: ValueError("boom"))


@dataclass
class StopYourself:
    pass


class Counter(Actor[Add | Get | Boom | StopYourself]):
    """Counts; logs lifecycle hooks into a shared list."""

    def __init__(self, tag: str, log: list[tuple[str, str]]) -> None:
        self.tag = tag
        self.log = log
        self.total = 0

    async def on_start(self) -> None:
        self.log.append(("start", self.tag))

    async def on_stop(self) -> None:
        self.log.append(("stop", self.tag))

    async def on_restart(self, cause: BaseException | None) -> None:
        self.log.append(("restart", f"{self.tag}:{type(cause).__name__}"))

    async def receive(self, message: Add | Get | Boom | StopYourself) -> int | None:
        match message:
            case Add(n):
                self.total += n
            case Get():
                return self.total
            case Boom(error):
                raise error
            case StopYourself():
                self.context.stop_self()
        return None


@dataclass
class Spec:
    tag: str
    restart: str = "permanent"


class Parent(Actor[Get]):
    """Spawns its children in on_start (so a restart of the parent re-creates them)."""

    def __init__(self, specs: list[Spec], log: list[tuple[str, str]]) -> None:
        self.specs = specs
        self.log = log

    async def on_start(self) -> None:
        for spec in self.specs:
            await self.context.spawn(
                Counter,
                spec.tag,
                self.log,
                name=spec.tag,
                restart=spec.restart,  # type: ignore[arg-type]
            )

    async def receive(self, message: Get) -> list[str]:
        return [ref.name for ref in self.context.children]


async def _parent(
    kit: ActorTestKit, strategy: SupervisorStrategy, specs: list[Spec], log: list[tuple[str, str]]
) -> tuple[ActorRef[Get], dict[str, ActorRef[Add | Get | Boom | StopYourself]]]:
    parent = await kit.spawn(Parent, specs, log, name="p", strategy=strategy)
    children = {s.tag: kit.system.lookup(f"p/{s.tag}") for s in specs}
    return parent, children  # type: ignore[return-value]


async def _fail(ref: ActorRef[Add | Get | Boom | StopYourself]) -> None:
    with pytest.raises(ValueError, match="boom"):
        await ref.ask(Boom())


@pytest.mark.parametrize(
    ("strategy", "restarted"),
    [("one_for_one", {"b"}), ("one_for_all", {"a", "b", "c"}), ("rest_for_one", {"b", "c"})],
)
async def test_strategies_restart_the_right_children(strategy: str, restarted: set[str]) -> None:
    log: list[tuple[str, str]] = []
    async with ActorTestKit() as kit:
        sup = SupervisorStrategy(strategy, backoff=NO_BACKOFF)  # type: ignore[arg-type]
        _, kids = await _parent(kit, sup, [Spec("a"), Spec("b"), Spec("c")], log)
        for ref in kids.values():
            await ref.tell(Add(5))
        log.clear()
        await _fail(kids["b"])
        # Refs stay valid across restarts; restarted children lost their state.
        for tag, ref in kids.items():
            assert await ref.ask(Get()) == (0 if tag in restarted else 5)
        stops = [tag for event, tag in log if event == "stop"]
        starts = [tag for event, tag in log if event == "start"]
        order = ["a", "b", "c"]
        assert stops == [t for t in reversed(order) if t in restarted]  # reverse start order
        assert starts == [t for t in order if t in restarted]  # then start order
        assert ("restart", "b:ValueError") in log


async def test_restart_types_after_failure_and_self_stop() -> None:
    log: list[tuple[str, str]] = []
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        sup = SupervisorStrategy(backoff=NO_BACKOFF, max_restarts=10)
        specs = [Spec("perm", "permanent"), Spec("trans", "transient"), Spec("temp", "temporary")]
        _, kids = await _parent(kit, sup, specs, log)
        for ref in kids.values():
            probe.watch(ref)
        # A failure restarts permanent and transient children, stops a temporary one.
        for tag in ("perm", "trans", "temp"):
            await _fail(kids[tag])
        terminated = await probe.expect_message(Terminated)
        assert terminated.ref == kids["temp"]
        assert isinstance(terminated.reason, ValueError)
        assert await kids["perm"].ask(Get()) == 0
        assert await kids["trans"].ask(Get()) == 0
        # Stopping itself restarts only a permanent child.
        await kids["trans"].tell(StopYourself())
        terminated = await probe.expect_message(Terminated)
        assert terminated.ref == kids["trans"]
        assert terminated.reason is None
        await kids["perm"].tell(Add(1))
        await kids["perm"].tell(StopYourself())
        assert await kids["perm"].ask(Get()) == 0  # a fresh instance
        await probe.expect_no_message(0.05)


async def test_temporary_sibling_in_one_for_all_is_stopped_not_restarted() -> None:
    log: list[tuple[str, str]] = []
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        sup = SupervisorStrategy("one_for_all", backoff=NO_BACKOFF)
        _, kids = await _parent(kit, sup, [Spec("a"), Spec("t", "temporary")], log)
        probe.watch(kids["t"])
        await _fail(kids["a"])
        await probe.expect_terminated(kids["t"])
        assert await kids["a"].ask(Get()) == 0
        assert [ref.name for ref in kit.system.lookup("p")._cell.context.children] == ["a"]


async def test_the_asker_gets_the_callees_own_exception() -> None:
    class Oops(Exception):
        pass

    async with ActorTestKit() as kit:
        ref = await kit.spawn(Counter, "x", [], restart="permanent")
        error = Oops("specific")
        with pytest.raises(Oops) as info:
            await ref.ask(Boom(error))
        assert info.value is error


async def test_intensity_exceeded_escalates_to_the_parents_supervisor() -> None:
    log: list[tuple[str, str]] = []
    async with ActorTestKit(virtual_time=True) as kit:
        probe = await kit.create_probe()
        inner = SupervisorStrategy(max_restarts=2, period=10.0, backoff=NO_BACKOFF)
        parent = await kit.spawn(Parent, [Spec("a"), Spec("b")], log, name="p", strategy=inner)
        probe.watch(parent)  # temporary parent: escalation stops it
        a = kit.system.lookup("p/a")
        for _ in range(2):
            await _fail(a)  # type: ignore[arg-type]
            assert await a.ask(Get()) == 0
        await _fail(a)  # type: ignore[arg-type]
        terminated = await probe.expect_terminated(parent)
        assert isinstance(terminated.reason, RestartIntensityExceededError)
        assert isinstance(terminated.reason.__cause__, ValueError)
        assert ("stop", "b") in log  # the supervisor stopped all its children first
        with pytest.raises(ActorStoppedError):
            await a.tell(Add(1))


async def test_restarts_spread_beyond_the_period_do_not_escalate() -> None:
    async with ActorTestKit(virtual_time=True) as kit:
        clock = kit.virtual_clock
        sup = SupervisorStrategy(max_restarts=1, period=5.0, backoff=NO_BACKOFF)
        parent = await kit.spawn(Parent, [Spec("a")], [], name="p", strategy=sup)
        a = kit.system.lookup("p/a")
        for _ in range(4):
            await _fail(a)  # type: ignore[arg-type]
            assert await a.ask(Get()) == 0
            clock.advance(6.0)
        assert parent.is_alive


async def test_escalation_to_the_root_terminates_the_system() -> None:
    root = SupervisorStrategy(max_restarts=1, period=60.0, backoff=NO_BACKOFF)
    async with ActorTestKit(strategy=root) as kit:
        ref = await kit.spawn(Counter, "x", [], restart="permanent")
        await _fail(ref)
        assert await ref.ask(Get()) == 0
        await _fail(ref)
        reason = await asyncio.wait_for(kit.system.wait_terminated(), 2)
        assert isinstance(reason, RestartIntensityExceededError)
        assert kit.system.is_terminated


async def test_backoff_delays_follow_the_exponential_schedule() -> None:
    backoff = Backoff(min_s=1.0, max_s=3.0, factor=2.0, jitter=0.0)
    sup = SupervisorStrategy(max_restarts=10, period=100.0, backoff=backoff)
    async with ActorTestKit(virtual_time=True) as kit:
        clock = kit.virtual_clock
        ref = await kit.spawn(Parent, [Spec("a")], [], name="p", strategy=sup)
        a = kit.system.lookup("p/a")
        for expected in (1.0, 2.0, 3.0, 3.0):  # capped at max_s
            await _fail(a)  # type: ignore[arg-type]
            for _ in range(5):
                await asyncio.sleep(0)
            assert clock.pending() == [pytest.approx(expected)]
            clock.advance(expected - 0.001)
            await asyncio.sleep(0)
            assert clock.pending() == [pytest.approx(0.001)]  # not restarted yet
            clock.advance(0.001)
            assert await a.ask(Get()) == 0
        assert ref.is_alive


def test_backoff_jitter_stays_in_bounds() -> None:
    import random

    backoff = Backoff(min_s=1.0, max_s=10.0, factor=2.0, jitter=0.5)
    rng = random.Random(1)
    delays = [backoff.delay(3, rng) for _ in range(200)]
    assert all(4.0 <= d <= 6.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 100


async def test_messages_during_a_restart_are_stashed_and_replayed_in_order() -> None:
    backoff = Backoff(min_s=10.0, max_s=10.0, jitter=0.0)
    async with ActorTestKit(virtual_time=True) as kit:
        sup = SupervisorStrategy(backoff=backoff)
        parent = await kit.spawn(Parent, [Spec("a")], [], name="p", strategy=sup)
        a = kit.system.lookup("p/a")
        await _fail(a)  # type: ignore[arg-type]
        for n in (1, 10, 100):
            await a.tell(Add(n))
        pending_ask = asyncio.ensure_future(a.ask(Get(), timeout=5))
        await asyncio.sleep(0.01)
        assert not pending_ask.done()  # waiting for the restart
        assert len(a._cell.stash) == 4
        kit.virtual_clock.advance(10.0)
        assert await pending_ask == 111
        await a.tell(Add(1000))
        assert await a.ask(Get()) == 1111
        assert parent.is_alive


async def test_full_stash_backpressures_senders_without_losing_messages() -> None:
    backoff = Backoff(min_s=10.0, max_s=10.0, jitter=0.0)
    async with ActorTestKit(virtual_time=True) as kit:
        parent = await kit.spawn(
            Parent, [], [], name="p", strategy=SupervisorStrategy(backoff=backoff)
        )
        a = await parent._cell.context.spawn(
            Counter,
            "a",
            [],
            name="a",
            restart="permanent",
            mailbox=MailboxConfig(capacity=2, stash_capacity=3),
        )
        await _fail(a)
        sends = [asyncio.ensure_future(a.tell(Add(1))) for _ in range(8)]
        await asyncio.sleep(0.01)
        assert sum(s.done() for s in sends) == 5  # 3 stashed + 2 in the mailbox
        kit.virtual_clock.advance(10.0)
        await asyncio.gather(*sends)
        assert await a.ask(Get()) == 8


async def test_watch_requires_terminated_in_the_union() -> None:
    async with ActorTestKit() as kit:
        a = await kit.spawn(Counter, "a", [])
        b = await kit.spawn(Counter, "b", [])
        with pytest.raises(TypeError, match="does not accept Terminated"):
            a._cell.context.watch(b)


async def test_watching_a_dead_actor_delivers_terminated_at_once() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        a = await kit.spawn(Counter, "a", [])
        await kit.system.stop(a)
        terminated = await probe.expect_terminated(a)
        assert terminated.reason is None


async def test_crash_after_injects_a_bounded_number_of_faults() -> None:
    async with ActorTestKit() as kit:
        faulty = crash_after(Counter, 2, times=2)
        ref = await kit.spawn(
            faulty, "f", [], restart="permanent", strategy=SupervisorStrategy(backoff=NO_BACKOFF)
        )
        await ref.tell(Add(1))
        await ref.tell(Add(1))
        with pytest.raises(InjectedFault):
            await ref.ask(Get())
        assert await ref.ask(Get()) == 0
        await ref.tell(Add(1))
        with pytest.raises(InjectedFault):
            await ref.ask(Get())
        for _ in range(5):
            await ref.tell(Add(1))
        assert await ref.ask(Get()) == 5  # no more faults after `times`


class Forwarder(Actor[Add | Boom | Get]):
    """Asks its own child inside receive: the parent is busy while the child restarts."""

    supervisor_strategy = SupervisorStrategy(backoff=Backoff(min_s=0.01, max_s=0.01))

    async def on_start(self) -> None:
        self.child = await self.context.spawn(Counter, "c", [], name="c", restart="permanent")

    async def receive(self, message: Add | Boom | Get) -> int | None:
        try:
            result: int | None = await self.child.ask(message, timeout=2.0)
        except ValueError:
            return -1
        return result


async def test_a_parent_busy_asking_its_child_still_restarts_it() -> None:
    async with ActorTestKit() as kit:
        parent = await kit.spawn(Forwarder, name="f")
        await parent.ask(Add(2))
        assert await parent.ask(Boom(), timeout=3) == -1
        # This ask reaches the child while it waits for its restart; the parent is
        # blocked in receive the whole time and must not deadlock the restart.
        assert await parent.ask(Add(1), timeout=3) is None
        assert await parent.ask(Get(), timeout=3) == 1
