"""Supervision: strategies, restart types, intensity, backoff, stash, watch (OTP semantics).

Every actor here writes its lifecycle hooks into a shared journal, so a test can assert
the exact order in which a supervisor tore children down and started them again. Time
in backoff and intensity tests is a ``VirtualClock``: nothing waits on real time except
the short negative checks of ``expect_no_message``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from omni_actors import (
    Actor,
    ActorRef,
    ActorStoppedError,
    Backoff,
    MailboxConfig,
    Props,
    RestartIntensityExceededError,
    RestartType,
    SupervisorStrategy,
    Terminated,
)
from omni_actors.testing import (
    ActorTestKit,
    InjectedFault,
    TestProbe,
    consistently,
    crash_after,
    eventually,
)

NO_BACKOFF = Backoff(min_s=0.0, max_s=0.0, jitter=0.0)
LONG_BACKOFF = Backoff(min_s=10.0, max_s=10.0, jitter=0.0)


# -- messages --------------------------------------------------------------------------


@dataclass(frozen=True)
class Add:
    n: int


@dataclass(frozen=True)
class Get:
    pass


@dataclass(frozen=True)
class Boom:
    error: Exception = field(default_factory=lambda: ValueError("boom"))


@dataclass(frozen=True)
class StopYourself:
    pass


@dataclass(frozen=True)
class WatchIt:
    ref: ActorRef[Any]


@dataclass(frozen=True)
class Started:
    """Sent to an events probe from every ``on_start``."""

    tag: str


@dataclass(frozen=True, eq=False)
class Restarted:
    """Sent to an events probe from every ``on_restart``."""

    tag: str
    cause: BaseException | None


class Oops(Exception):
    """A failure type of the test's own, to check that exact types travel."""


WorkerMsg = Add | Get | Boom | StopYourself
Journal = list[tuple[str, str, object]]
"""(hook, actor tag, detail): ``("add", "a", 5)``, ``("restart", "a", cause)``, ..."""


def hooks(journal: Journal) -> list[tuple[str, str]]:
    """The lifecycle hooks in the journal, in order, without details."""
    return [(hook, tag) for hook, tag, _ in journal if hook in ("start", "stop", "restart")]


def added(journal: Journal, tag: str = "a") -> list[object]:
    """What ``tag`` added, in the order its instances received it."""
    return [n for hook, t, n in journal if hook == "add" and t == tag]


# -- actors ----------------------------------------------------------------------------


class Worker(Actor[WorkerMsg]):
    """Keeps a running total (state a restart must reset); journals every hook."""

    def __init__(self, tag: str, journal: Journal, events: ActorRef[object] | None = None):
        self.tag = tag
        self.journal = journal
        self.events = events
        self.total = 0

    async def on_start(self) -> None:
        self.journal.append(("start", self.tag, None))
        if self.events is not None:
            await self.events.tell(Started(self.tag))

    async def on_stop(self) -> None:
        self.journal.append(("stop", self.tag, None))

    async def on_restart(self, cause: BaseException | None) -> None:
        self.journal.append(("restart", self.tag, cause))
        if self.events is not None:
            await self.events.tell(Restarted(self.tag, cause))

    async def receive(self, message: WorkerMsg) -> int | None:
        match message:
            case Add(n):
                self.journal.append(("add", self.tag, n))
                self.total += n
            case Get():
                return self.total
            case Boom(error):
                raise error
            case StopYourself():
                self.context.stop_self()
        return None


@dataclass(frozen=True)
class Child:
    """How a ``Sup`` spawns one child. ``restart=None`` uses spawn's default."""

    tag: str
    restart: RestartType | None = "permanent"
    cls: type[Actor[Any]] = Worker
    args: tuple[Any, ...] = ()
    strategy: SupervisorStrategy | None = None
    mailbox: MailboxConfig | None = None


class Sup(Actor[Get]):
    """A supervisor that spawns its children in ``on_start``, so a restart re-creates them.

    ``Get`` answers the names of its live children, in start order.
    """

    def __init__(
        self,
        tag: str,
        journal: Journal,
        children: list[Child],
        events: ActorRef[object] | None = None,
    ) -> None:
        self.tag = tag
        self.journal = journal
        self.specs = children
        self.events = events

    async def on_start(self) -> None:
        self.journal.append(("start", self.tag, None))
        for spec in self.specs:
            props = Props(strategy=spec.strategy, mailbox=spec.mailbox)
            if spec.restart is not None:
                props = dataclasses.replace(props, restart=spec.restart)
            await self.context.spawn(
                spec.cls,
                spec.tag,
                self.journal,
                *spec.args,
                name=spec.tag,
                props=props,
                events=self.events,
            )

    async def on_stop(self) -> None:
        self.journal.append(("stop", self.tag, None))

    async def on_restart(self, cause: BaseException | None) -> None:
        self.journal.append(("restart", self.tag, cause))
        if self.events is not None:
            await self.events.tell(Restarted(self.tag, cause))

    async def receive(self, message: Get) -> list[str]:
        return [ref.name for ref in self.context.children]


class Watcher(Actor[WatchIt | Terminated]):
    """Watches what it is told to and forwards every ``Terminated`` to ``sink``."""

    def __init__(self, sink: ActorRef[object]) -> None:
        self.sink = sink

    async def receive(self, message: WatchIt | Terminated) -> None:
        match message:
            case WatchIt(ref):
                self.context.watch(ref)
            case Terminated():
                await self.sink.tell(message)


class NotAWatcher(Actor[WatchIt]):
    """Tries to watch without declaring ``Terminated``: the runtime must refuse."""

    async def receive(self, message: WatchIt) -> None:
        self.context.watch(message.ref)


# -- helpers ---------------------------------------------------------------------------


async def spawn_sup(
    kit: ActorTestKit,
    strategy: SupervisorStrategy,
    children: list[Child],
    journal: Journal,
    *,
    events: TestProbe | None = None,
    restart: RestartType = "temporary",
) -> tuple[ActorRef[Get], dict[str, ActorRef[WorkerMsg]]]:
    """Spawn a top-level ``Sup`` called ``p``; return it and its children by tag."""
    sup = await kit.spawn(
        Sup,
        "p",
        journal,
        children,
        events.ref if events else None,
        name="p",
        props=Props(strategy=strategy, restart=restart),
    )
    return sup, {c.tag: kit.system.lookup(f"p/{c.tag}") for c in children}


async def fail(ref: ActorRef[WorkerMsg], error: Exception | None = None) -> Exception:
    """Make ``ref`` raise ``error`` in ``receive``; the ask must re-raise exactly it."""
    error = error or ValueError("boom")
    with pytest.raises(type(error)) as info:
        await ref.ask(Boom(error))
    assert info.value is error
    return error


# -- strategies ------------------------------------------------------------------------


async def test_one_for_one_restarts_only_the_failed_child(actor_testkit: ActorTestKit) -> None:
    journal: Journal = []
    strategy = SupervisorStrategy("one_for_one", backoff=NO_BACKOFF)
    sup, kids = await spawn_sup(
        actor_testkit, strategy, [Child("a"), Child("b"), Child("c")], journal
    )
    for n, ref in enumerate(kids.values(), start=1):
        await ref.tell(Add(n))
    journal.clear()

    error = await fail(kids["b"])

    assert await kids["a"].ask(Get()) == 1
    assert await kids["b"].ask(Get()) == 0  # a fresh instance, through the same ref
    assert await kids["c"].ask(Get()) == 3
    assert hooks(journal) == [("stop", "b"), ("restart", "b"), ("start", "b")]
    assert ("restart", "b", error) in journal
    assert actor_testkit.system.lookup("p/b") == kids["b"]
    assert all(ref.is_alive for ref in kids.values())
    assert await sup.ask(Get()) == ["a", "b", "c"]  # start order kept


async def test_one_for_all_stops_all_in_reverse_then_starts_all_in_order(
    actor_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    strategy = SupervisorStrategy("one_for_all", backoff=NO_BACKOFF)
    _, kids = await spawn_sup(
        actor_testkit, strategy, [Child("a"), Child("b"), Child("c")], journal
    )
    for ref in kids.values():
        await ref.tell(Add(7))
    journal.clear()

    error = await fail(kids["b"])

    for ref in kids.values():
        assert await ref.ask(Get()) == 0
    assert hooks(journal) == [
        ("stop", "c"),
        ("stop", "b"),
        ("stop", "a"),
        ("restart", "a"),
        ("start", "a"),
        ("restart", "b"),
        ("start", "b"),
        ("restart", "c"),
        ("start", "c"),
    ]
    # Every restarted sibling learns which failure restarted it.
    assert [cause for hook, _, cause in journal if hook == "restart"] == [error] * 3


async def test_rest_for_one_restarts_the_failed_child_and_those_started_after_it(
    actor_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    strategy = SupervisorStrategy("rest_for_one", backoff=NO_BACKOFF)
    specs = [Child("a"), Child("b"), Child("c"), Child("d")]
    _, kids = await spawn_sup(actor_testkit, strategy, specs, journal)
    for ref in kids.values():
        await ref.tell(Add(7))
    journal.clear()

    await fail(kids["b"])

    assert [await kids[t].ask(Get()) for t in "abcd"] == [7, 0, 0, 0]
    assert hooks(journal) == [
        ("stop", "d"),
        ("stop", "c"),
        ("stop", "b"),
        ("restart", "b"),
        ("start", "b"),
        ("restart", "c"),
        ("start", "c"),
        ("restart", "d"),
        ("start", "d"),
    ]


async def test_rest_for_one_failure_of_the_last_child_restarts_only_it(
    actor_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    strategy = SupervisorStrategy("rest_for_one", backoff=NO_BACKOFF)
    _, kids = await spawn_sup(actor_testkit, strategy, [Child("a"), Child("b")], journal)
    await kids["a"].tell(Add(1))
    journal.clear()
    await fail(kids["b"])
    assert await kids["b"].ask(Get()) == 0
    assert await kids["a"].ask(Get()) == 1
    assert hooks(journal) == [("stop", "b"), ("restart", "b"), ("start", "b")]


# -- restart types ---------------------------------------------------------------------


async def test_permanent_restarts_after_a_failure_and_after_stopping_itself(
    actor_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    probe = await actor_testkit.create_probe()
    strategy = SupervisorStrategy(backoff=NO_BACKOFF, max_restarts=10)
    _, kids = await spawn_sup(actor_testkit, strategy, [Child("a", "permanent")], journal)
    a = kids["a"]
    probe.watch(a)

    await a.tell(Add(5))
    error = await fail(a)
    assert await a.ask(Get()) == 0

    await a.tell(Add(5))
    await a.tell(StopYourself())
    assert await a.ask(Get()) == 0  # stopped itself, and came back fresh
    assert [cause for hook, _, cause in journal if hook == "restart"] == [error, None]
    await probe.expect_no_message(0.05)  # restarts are not terminations
    assert a.is_alive


async def test_transient_restarts_after_a_failure_but_not_after_stopping_itself(
    actor_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    probe = await actor_testkit.create_probe()
    strategy = SupervisorStrategy(backoff=NO_BACKOFF, max_restarts=10)
    sup, kids = await spawn_sup(actor_testkit, strategy, [Child("t", "transient")], journal)
    t = kids["t"]
    probe.watch(t)

    await t.tell(Add(5))
    await fail(t)
    assert await t.ask(Get()) == 0
    await probe.expect_no_message(0.05)

    await t.tell(StopYourself())
    terminated = await probe.expect_terminated(t)
    assert terminated.reason is None
    assert not t.is_alive
    assert await sup.ask(Get()) == []
    assert hooks(journal).count(("start", "t")) == 2  # initial start + one restart
    with pytest.raises(ActorStoppedError):
        await t.tell(Add(1))


@pytest.mark.parametrize("restart", [None, "temporary"], ids=["default", "explicit"])
async def test_temporary_child_is_never_restarted(
    actor_testkit: ActorTestKit, restart: RestartType | None
) -> None:
    journal: Journal = []
    probe = await actor_testkit.create_probe()
    strategy = SupervisorStrategy(backoff=NO_BACKOFF)
    sup, kids = await spawn_sup(
        actor_testkit, strategy, [Child("a"), Child("x", restart), Child("y", restart)], journal
    )
    probe.watch(kids["x"])
    probe.watch(kids["y"])
    await kids["a"].tell(Add(3))

    error = await fail(kids["x"])
    terminated = await probe.expect_terminated(kids["x"])
    assert terminated.reason is error

    await kids["y"].tell(StopYourself())
    terminated = await probe.expect_terminated(kids["y"])
    assert terminated.reason is None

    assert await sup.ask(Get()) == ["a"]
    assert await kids["a"].ask(Get()) == 3  # a temporary failure restarts nobody
    assert ("restart", "x") not in hooks(journal)
    assert ("restart", "y") not in hooks(journal)
    await probe.expect_no_message(0.05)


async def test_unsupervised_top_level_failure_stops_the_actor(actor_testkit: ActorTestKit) -> None:
    probe = await actor_testkit.create_probe()
    ref = await actor_testkit.spawn(Worker, "solo", [])
    probe.watch(ref)
    error = await fail(ref, Oops("no restart for me"))
    terminated = await probe.expect_terminated(ref)
    assert terminated.reason is error
    with pytest.raises(ActorStoppedError):
        await ref.ask(Get())


async def test_temporary_sibling_in_one_for_all_is_stopped_not_restarted(
    actor_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    probe = await actor_testkit.create_probe()
    strategy = SupervisorStrategy("one_for_all", backoff=NO_BACKOFF)
    specs = [Child("a"), Child("t", "temporary"), Child("c")]
    sup, kids = await spawn_sup(actor_testkit, strategy, specs, journal)
    probe.watch(kids["t"])
    for ref in kids.values():
        await ref.tell(Add(1))
    journal.clear()

    await fail(kids["c"])

    await probe.expect_terminated(kids["t"])
    assert await kids["a"].ask(Get()) == 0
    assert await kids["c"].ask(Get()) == 0
    assert await sup.ask(Get()) == ["a", "c"]
    assert ("stop", "t") in hooks(journal)
    assert ("restart", "t") not in hooks(journal)
    assert ("start", "t") not in hooks(journal)


async def test_failure_of_a_temporary_child_in_one_for_all_restarts_nobody(
    actor_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    strategy = SupervisorStrategy("one_for_all", backoff=NO_BACKOFF)
    specs = [Child("a"), Child("t", "temporary")]
    sup, kids = await spawn_sup(actor_testkit, strategy, specs, journal)
    await kids["a"].tell(Add(4))
    await fail(kids["t"])
    await eventually(lambda: not kids["t"].is_alive)
    assert await kids["a"].ask(Get()) == 4
    assert await sup.ask(Get()) == ["a"]


# -- causes and replies ----------------------------------------------------------------


async def test_on_restart_gets_the_exception_and_the_asker_gets_its_exact_type(
    actor_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    events = await actor_testkit.create_probe()
    strategy = SupervisorStrategy(backoff=NO_BACKOFF)
    _, kids = await spawn_sup(actor_testkit, strategy, [Child("a")], journal, events=events)
    await events.expect_message(Started("a"))

    error = Oops("specific")
    with pytest.raises(Oops) as info:
        await kids["a"].ask(Boom(error))
    assert info.value is error

    restarted = await events.expect_message(Restarted)
    assert restarted.tag == "a"
    assert restarted.cause is error
    await events.expect_message(Started("a"))  # on_restart comes before on_start


# -- restart intensity -----------------------------------------------------------------


async def test_intensity_exceeded_stops_children_and_escalates_to_the_parent(
    virtual_testkit: ActorTestKit,
) -> None:
    """g (one_for_one) supervises s (permanent), which supervises a and b."""
    journal: Journal = []
    events = await virtual_testkit.create_probe()
    inner = SupervisorStrategy(max_restarts=2, period=10.0, backoff=NO_BACKOFF)
    s = Child("s", cls=Sup, args=([Child("a"), Child("b")],), strategy=inner)
    outer = SupervisorStrategy(backoff=NO_BACKOFF)
    await virtual_testkit.spawn(
        Sup, "g", journal, [s], events.ref, name="g", props=Props(strategy=outer)
    )
    a = virtual_testkit.system.lookup("g/s/a")
    b = virtual_testkit.system.lookup("g/s/b")
    await b.tell(Add(1))
    await events.expect_message(Started("a"))
    await events.expect_message(Started("b"))

    for _ in range(2):  # max_restarts restarts are allowed
        await fail(a)
        restarted = await events.expect_message(Restarted)
        assert restarted.tag == "a"
        await events.expect_message(Started("a"))
        assert await a.ask(Get()) == 0
    assert await b.ask(Get()) == 1
    journal.clear()

    last = await fail(a)  # one more within the period: s gives up

    restarted = await events.expect_message(Restarted)
    assert restarted.tag == "s"  # g saw s fail, and restarted it
    escalation = restarted.cause
    assert isinstance(escalation, RestartIntensityExceededError)
    assert escalation.__cause__ is last
    assert escalation.supervisor == "/g/s"
    assert escalation.child == "/g/s/a"
    # s stopped all its children (newest first) before failing itself.
    assert hooks(journal)[:3] == [("stop", "b"), ("stop", "a"), ("stop", "s")]
    assert not a.is_alive
    assert not b.is_alive
    with pytest.raises(ActorStoppedError):
        await b.tell(Add(1))
    # The restarted s spawned fresh children under the same paths.
    await events.expect_message(Started("a"))
    await events.expect_message(Started("b"))
    new_b = virtual_testkit.system.lookup("g/s/b")
    assert new_b != b
    assert await new_b.ask(Get()) == 0


async def test_intensity_exceeded_stops_a_temporary_supervisor(
    virtual_testkit: ActorTestKit,
) -> None:
    journal: Journal = []
    probe = await virtual_testkit.create_probe()
    strategy = SupervisorStrategy(max_restarts=0, period=10.0, backoff=NO_BACKOFF)
    sup, kids = await spawn_sup(virtual_testkit, strategy, [Child("a")], journal)
    probe.watch(sup)

    error = await fail(kids["a"])

    terminated = await probe.expect_terminated(sup)
    assert isinstance(terminated.reason, RestartIntensityExceededError)
    assert terminated.reason.__cause__ is error
    assert not kids["a"].is_alive
    assert ("restart", "a") not in hooks(journal)


@pytest.mark.parametrize(("gap", "escalates"), [(6.0, False), (4.0, True)])
async def test_only_restarts_within_the_period_count_towards_intensity(
    virtual_testkit: ActorTestKit, gap: float, escalates: bool
) -> None:
    clock = virtual_testkit.virtual_clock
    probe = await virtual_testkit.create_probe()
    strategy = SupervisorStrategy(max_restarts=1, period=5.0, backoff=NO_BACKOFF)
    sup, kids = await spawn_sup(virtual_testkit, strategy, [Child("a")], [])
    probe.watch(sup)
    a = kids["a"]

    await fail(a)
    assert await a.ask(Get()) == 0
    for _ in range(3):
        clock.advance(gap)
        await fail(a)
        if escalates:
            terminated = await probe.expect_terminated(sup)
            assert isinstance(terminated.reason, RestartIntensityExceededError)
            return
        assert await a.ask(Get()) == 0
    assert sup.is_alive
    await probe.expect_no_message(0.05)


# Binary fractions: the clock's sums and the window's difference are exact.
_EPSILON = 2.0**-10


@pytest.mark.parametrize(
    ("gap", "escalates"),
    [(5.0 - _EPSILON, True), (5.0, True), (5.0 + _EPSILON, False)],
    ids=["just-inside", "exactly-period-ago", "just-outside"],
)
async def test_a_restart_exactly_period_ago_still_counts(
    virtual_testkit: ActorTestKit, gap: float, escalates: bool
) -> None:
    """OTP's window: a restart counts while it is at most ``period`` old (closed at
    both ends, ``supervisor:add_restart/3`` keeps ``R >= Now - Period``)."""
    clock = virtual_testkit.virtual_clock
    probe = await virtual_testkit.create_probe()
    strategy = SupervisorStrategy(max_restarts=1, period=5.0, backoff=NO_BACKOFF)
    sup, kids = await spawn_sup(virtual_testkit, strategy, [Child("a")], [])
    probe.watch(sup)
    a = kids["a"]

    await fail(a)  # restart 1, at 0.0: within the intensity
    assert await a.ask(Get()) == 0
    clock.advance(gap)
    await fail(a)  # restart 2, ``gap`` later: with restart 1, one too many?
    if escalates:
        terminated = await probe.expect_terminated(sup)
        assert isinstance(terminated.reason, RestartIntensityExceededError)
    else:
        assert await a.ask(Get()) == 0
        assert sup.is_alive


async def test_a_self_stop_of_a_permanent_child_counts_as_a_restart(
    virtual_testkit: ActorTestKit,
) -> None:
    probe = await virtual_testkit.create_probe()
    strategy = SupervisorStrategy(max_restarts=1, period=5.0, backoff=NO_BACKOFF)
    sup, kids = await spawn_sup(virtual_testkit, strategy, [Child("a")], [])
    probe.watch(sup)
    await kids["a"].tell(StopYourself())
    assert await kids["a"].ask(Get()) == 0
    await kids["a"].tell(StopYourself())
    terminated = await probe.expect_terminated(sup)
    assert isinstance(terminated.reason, RestartIntensityExceededError)
    assert terminated.reason.__cause__ is None


async def test_escalation_to_the_root_terminates_the_system() -> None:
    journal: Journal = []
    root = SupervisorStrategy(max_restarts=1, period=60.0, backoff=NO_BACKOFF)
    async with ActorTestKit(strategy=root) as kit:
        ref = await kit.spawn(Worker, "top", journal, name="top", props=Props(restart="permanent"))
        await fail(ref)
        assert await ref.ask(Get()) == 0
        assert not kit.system.is_terminated

        last = await fail(ref)

        reason = await asyncio.wait_for(kit.system.wait_terminated(), 2)
        assert isinstance(reason, RestartIntensityExceededError)
        assert reason.__cause__ is last
        assert kit.system.is_terminated
        assert not ref.is_alive
        assert hooks(journal)[-1] == ("stop", "top")
        with pytest.raises(ActorStoppedError):
            await kit.spawn(Worker, "late", journal)


# -- backoff ---------------------------------------------------------------------------


async def test_restarts_wait_for_the_exponential_backoff(virtual_testkit: ActorTestKit) -> None:
    clock = virtual_testkit.virtual_clock
    events = await virtual_testkit.create_probe()
    backoff = Backoff(min_s=1.0, max_s=5.0, factor=2.0, jitter=0.0)
    strategy = SupervisorStrategy(max_restarts=10, period=100.0, backoff=backoff)
    _, kids = await spawn_sup(virtual_testkit, strategy, [Child("a")], [], events=events)
    a = kids["a"]
    await events.expect_message(Started("a"))
    epsilon = 0.01

    for delay in (1.0, 2.0, 4.0, 5.0, 5.0):  # min_s * factor**(n-1), capped at max_s
        await a.tell(Add(1))
        error = await fail(a)
        await eventually(clock.pending)
        assert clock.pending() == [pytest.approx(delay)]

        answer = asyncio.ensure_future(a.ask(Get()))
        clock.advance(delay - epsilon)
        assert clock.pending() == [pytest.approx(epsilon)]
        await events.expect_no_message(0.02)  # still waiting for the restart
        assert not answer.done()

        clock.advance(epsilon)
        restarted = await events.expect_message(Restarted)
        assert restarted.cause is error
        await events.expect_message(Started("a"))
        assert await answer == 0
        assert clock.pending() == []


async def test_backoff_starts_over_after_a_quiet_period(virtual_testkit: ActorTestKit) -> None:
    clock = virtual_testkit.virtual_clock
    backoff = Backoff(min_s=1.0, max_s=60.0, factor=3.0, jitter=0.0)
    strategy = SupervisorStrategy(max_restarts=10, period=10.0, backoff=backoff)
    _, kids = await spawn_sup(virtual_testkit, strategy, [Child("a")], [])
    a = kids["a"]

    for delay in (1.0, 3.0, 1.0):
        await fail(a)
        await eventually(clock.pending)
        assert clock.pending() == [pytest.approx(delay)]
        clock.advance(delay)
        assert await a.ask(Get()) == 0
        if delay == 3.0:
            clock.advance(20.0)  # both earlier restarts leave the period


async def test_backoff_is_counted_per_child(virtual_testkit: ActorTestKit) -> None:
    clock = virtual_testkit.virtual_clock
    backoff = Backoff(min_s=1.0, max_s=60.0, factor=2.0, jitter=0.0)
    strategy = SupervisorStrategy(max_restarts=10, period=100.0, backoff=backoff)
    _, kids = await spawn_sup(virtual_testkit, strategy, [Child("a"), Child("b")], [])
    await fail(kids["a"])
    await eventually(clock.pending)
    await fail(kids["b"])
    await eventually(lambda: len(clock.pending()) == 2)
    assert clock.pending() == [pytest.approx(1.0), pytest.approx(1.0)]
    clock.advance(1.0)
    assert await kids["a"].ask(Get()) == 0
    assert await kids["b"].ask(Get()) == 0


def test_backoff_jitter_stretches_the_delay_within_bounds() -> None:
    backoff = Backoff(min_s=1.0, max_s=10.0, factor=2.0, jitter=0.5)
    rng = random.Random(1)
    delays = [backoff.delay(3, rng) for _ in range(200)]
    assert all(4.0 <= d <= 6.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 100
    assert Backoff(min_s=1.0, max_s=10.0, jitter=0.0).delay(10, rng) == 10.0


# -- stash -----------------------------------------------------------------------------


async def test_messages_during_a_restart_are_stashed_and_replayed_in_order(
    virtual_testkit: ActorTestKit,
) -> None:
    clock = virtual_testkit.virtual_clock
    journal: Journal = []
    strategy = SupervisorStrategy(backoff=LONG_BACKOFF)
    # A stash of 2: messages 1-2 are stashed, 3-4 (and the ask) wait in the mailbox.
    child = Child("a", mailbox=MailboxConfig(stash_capacity=2))
    _, kids = await spawn_sup(virtual_testkit, strategy, [child], journal)
    a = kids["a"]
    await a.tell(Add(1000))  # state of the old instance, lost with it
    await fail(a)
    await eventually(clock.pending)

    for n in (1, 2, 3, 4):
        await a.tell(Add(n))
    answer = asyncio.ensure_future(a.ask(Get()))
    # nothing handled while waiting for the restart
    await consistently(lambda: not answer.done() and added(journal) == [1000])

    clock.advance(10.0)
    await a.tell(Add(5))  # newer than everything stashed
    assert await answer == 1 + 2 + 3 + 4
    assert await a.ask(Get()) == 15
    assert added(journal) == [1000, 1, 2, 3, 4, 5]


async def test_a_full_stash_backpressures_senders_without_losing_messages(
    virtual_testkit: ActorTestKit,
) -> None:
    clock = virtual_testkit.virtual_clock
    journal: Journal = []
    strategy = SupervisorStrategy(backoff=LONG_BACKOFF)
    child = Child("a", mailbox=MailboxConfig(capacity=2, stash_capacity=3))
    _, kids = await spawn_sup(virtual_testkit, strategy, [child], journal)
    a = kids["a"]
    await fail(a)
    await eventually(clock.pending)

    sends = [asyncio.ensure_future(a.tell(Add(n))) for n in range(1, 9)]
    await eventually(lambda: sum(s.done() for s in sends) == 5)  # 3 stashed + 2 in the mailbox
    # the rest wait, in order
    await consistently(lambda: [s.done() for s in sends] == [True] * 5 + [False] * 3)

    clock.advance(10.0)
    await asyncio.gather(*sends)
    assert await a.ask(Get()) == sum(range(1, 9))
    assert added(journal) == list(range(1, 9))


async def test_one_for_all_siblings_stash_while_the_group_waits_to_restart(
    virtual_testkit: ActorTestKit,
) -> None:
    clock = virtual_testkit.virtual_clock
    journal: Journal = []
    strategy = SupervisorStrategy("one_for_all", backoff=LONG_BACKOFF)
    _, kids = await spawn_sup(virtual_testkit, strategy, [Child("a"), Child("b")], journal)
    await kids["b"].tell(Add(100))
    await fail(kids["a"])
    await eventually(clock.pending)

    answer = asyncio.ensure_future(kids["b"].ask(Get()))
    # the ask is set aside (b is suspended with its group) before the Add is sent
    await eventually(lambda: virtual_testkit.stashed_messages(kids["b"]) == [Get()])
    await kids["b"].tell(Add(1))
    await consistently(lambda: not answer.done())
    clock.advance(10.0)
    # Asked before the restart: answered by the fresh instance, before the Add.
    assert await answer == 0
    assert await kids["b"].ask(Get()) == 1


# -- watch / Terminated ----------------------------------------------------------------


async def test_watch_requires_terminated_in_the_watchers_union(
    actor_testkit: ActorTestKit,
) -> None:
    target = await actor_testkit.spawn(Worker, "target", [])
    not_a_watcher = await actor_testkit.spawn(NotAWatcher)
    with pytest.raises(TypeError, match="Terminated"):
        await not_a_watcher.ask(WatchIt(target))

    probe = await actor_testkit.create_probe()
    watcher = await actor_testkit.spawn(Watcher, probe.ref)
    await watcher.ask(WatchIt(target))
    await actor_testkit.system.stop(target)
    terminated = await probe.expect_message(Terminated)
    assert terminated.ref == target
    assert terminated.reason is None


async def test_terminated_reason_is_none_after_a_normal_stop(actor_testkit: ActorTestKit) -> None:
    probe = await actor_testkit.create_probe()
    stopped = await actor_testkit.spawn(Worker, "s", [])
    quit_ = await actor_testkit.spawn(Worker, "q", [])
    probe.watch(stopped)
    probe.watch(quit_)
    await actor_testkit.system.stop(stopped)
    assert (await probe.expect_terminated(stopped)).reason is None
    await quit_.tell(StopYourself())
    assert (await probe.expect_terminated(quit_)).reason is None


async def test_watching_a_dead_actor_delivers_terminated_at_once(
    actor_testkit: ActorTestKit,
) -> None:
    probe = await actor_testkit.create_probe()
    stopped = await actor_testkit.spawn(Worker, "s", [])
    crashed = await actor_testkit.spawn(Worker, "c", [])
    await actor_testkit.system.stop(stopped)
    error = await fail(crashed)
    await eventually(lambda: not crashed.is_alive)

    assert (await probe.expect_terminated(stopped)).reason is None
    assert (await probe.expect_terminated(crashed)).reason is error

    watcher = await actor_testkit.spawn(Watcher, probe.ref)
    await watcher.ask(WatchIt(crashed))
    terminated = await probe.expect_message(Terminated)
    assert terminated.ref == crashed
    assert terminated.reason is error


async def test_a_restart_does_not_send_terminated(actor_testkit: ActorTestKit) -> None:
    probe = await actor_testkit.create_probe()
    strategy = SupervisorStrategy("one_for_all", backoff=NO_BACKOFF)
    _, kids = await spawn_sup(actor_testkit, strategy, [Child("a"), Child("b")], [])
    watcher = await actor_testkit.spawn(Watcher, probe.ref)
    for ref in kids.values():
        await watcher.ask(WatchIt(ref))
    await fail(kids["a"])
    assert await kids["b"].ask(Get()) == 0
    await kids["a"].tell(StopYourself())
    assert await kids["a"].ask(Get()) == 0
    await probe.expect_no_message(0.05)
    # The watch survives the restarts: a final stop is still reported.
    await actor_testkit.system.stop(kids["b"])
    assert (await probe.expect_message(Terminated)).ref == kids["b"]


# -- fault injection -------------------------------------------------------------------


async def test_crash_after_injects_a_bounded_number_of_faults(actor_testkit: ActorTestKit) -> None:
    journal: Journal = []
    faulty = crash_after(Worker, 2, times=2)
    strategy = SupervisorStrategy(backoff=NO_BACKOFF)
    _, kids = await spawn_sup(actor_testkit, strategy, [Child("f", cls=faulty)], journal)
    f = kids["f"]

    # Each fresh instance handles 2 messages and crashes on the third.
    await f.tell(Add(1))
    await f.tell(Add(1))
    with pytest.raises(InjectedFault):
        await f.ask(Get())
    assert await f.ask(Get()) == 0  # restarted: state reset
    await f.tell(Add(1))
    with pytest.raises(InjectedFault):
        await f.ask(Get())
    for _ in range(5):
        await f.tell(Add(1))
    assert await f.ask(Get()) == 5  # no more faults after `times`
    restarts = [cause for hook, _, cause in journal if hook == "restart"]
    assert len(restarts) == 2
    assert all(isinstance(cause, InjectedFault) for cause in restarts)


async def test_crash_after_without_a_cap_trips_the_restart_intensity(
    virtual_testkit: ActorTestKit,
) -> None:
    probe = await virtual_testkit.create_probe()
    faulty = crash_after(Worker, 0, times=None)
    strategy = SupervisorStrategy(max_restarts=2, period=5.0, backoff=NO_BACKOFF)
    sup, kids = await spawn_sup(virtual_testkit, strategy, [Child("f", cls=faulty)], [])
    probe.watch(sup)
    for _ in range(3):
        with pytest.raises(InjectedFault):
            await kids["f"].ask(Get())
    terminated = await probe.expect_terminated(sup)
    assert isinstance(terminated.reason, RestartIntensityExceededError)
    assert isinstance(terminated.reason.__cause__, InjectedFault)


# -- supervisor and cell do not wait on each other -------------------------------------


class Forwarder(Actor[WorkerMsg]):
    """Asks its own child inside ``receive``: the parent is busy while the child restarts."""

    supervisor_strategy = SupervisorStrategy(backoff=LONG_BACKOFF)

    async def on_start(self) -> None:
        self.child = await self.context.spawn(
            Worker, "c", [], name="c", props=Props(restart="permanent")
        )

    async def receive(self, message: WorkerMsg) -> int | None:
        try:
            result: int | None = await self.child.ask(message, timeout=2.0)
        except ValueError:
            return -1
        return result


async def test_a_parent_busy_asking_its_child_still_restarts_it(
    virtual_testkit: ActorTestKit,
) -> None:
    clock = virtual_testkit.virtual_clock
    parent = await virtual_testkit.spawn(Forwarder, name="f")
    await parent.ask(Add(2))
    assert await parent.ask(Boom()) == -1
    # This ask reaches the child while it waits for its restart; the parent is blocked
    # in receive the whole time, and the restart must still happen.
    answer = asyncio.ensure_future(parent.ask(Get()))
    await eventually(clock.pending)
    await consistently(lambda: not answer.done())
    clock.advance(10.0)
    assert await answer == 0
