"""``ChildFailed``: a parent that lists it hears of every failure of its children.

Supervision still decides what happens to the child; the signal only tells the parent,
once per failure, whatever that decision is. A normal stop sends none, and a parent that
does not list it (``Actor[object]`` included) sees no difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from omni_actors import (
    Actor,
    ActorRef,
    Backoff,
    ChildFailed,
    Props,
    RestartType,
    SupervisorStrategy,
    Terminated,
)
from omni_actors.testing import ActorTestKit, TestProbe

NO_BACKOFF = SupervisorStrategy(backoff=Backoff(min_s=0.0, max_s=0.0, jitter=0.0))


@dataclass(frozen=True)
class Get:
    pass


@dataclass(frozen=True)
class Boom:
    error: Exception = field(default_factory=lambda: ValueError("boom"))


@dataclass(frozen=True)
class StopYourself:
    pass


ChildMsg = Get | Boom | StopYourself


class Child(Actor[ChildMsg]):
    """Counts what it handled (a restart resets it); fails or stops itself on request."""

    def __init__(self) -> None:
        self.handled = 0

    async def receive(self, message: ChildMsg) -> int | None:
        match message:
            case Get():
                self.handled += 1
                return self.handled
            case Boom(error):
                raise error
            case StopYourself():
                self.context.stop_self()
        return None


class FailsFirstRestart(Child):
    """Its first restart attempt fails; the next one succeeds."""

    restarts = 0

    async def on_restart(self, cause: BaseException | None) -> None:
        type(self).restarts += 1
        if type(self).restarts == 1:
            raise RuntimeError("restart failed")


class Parent(Actor[ChildFailed | Terminated]):
    """Spawns one child (watched if asked) and forwards every signal to ``sink``."""

    def __init__(
        self,
        sink: ActorRef[object],
        restart: RestartType,
        watch: bool = False,
        child: type[Child] = Child,
    ) -> None:
        self.sink = sink
        self.restart: RestartType = restart
        self.watch = watch
        self.child = child

    async def on_start(self) -> None:
        ref = await self.context.spawn(self.child, name="child", props=Props(restart=self.restart))
        if self.watch:
            self.context.watch(ref)

    async def receive(self, message: ChildFailed | Terminated) -> None:
        await self.sink.tell(message)


class CatchAll(Actor[object]):
    """A parent that accepts anything but does not list ``ChildFailed`` explicitly."""

    def __init__(self, sink: ActorRef[object]) -> None:
        self.sink = sink

    async def on_start(self) -> None:
        await self.context.spawn(Child, name="child", props=Props(restart="permanent"))

    async def receive(self, message: object) -> None:
        await self.sink.tell(message)


async def start(
    kit: ActorTestKit, restart: RestartType, *, watch: bool = False, child: type[Child] = Child
) -> tuple[TestProbe, ActorRef[ChildMsg]]:
    """A probe and the child of a fresh ``Parent``."""
    probe = await kit.create_probe()
    await kit.spawn(
        Parent, probe.ref, restart, watch, child, name="p", props=Props(strategy=NO_BACKOFF)
    )
    return probe, kit.system.lookup("p/child")


async def fail(child: ActorRef[ChildMsg]) -> Exception:
    error = ValueError("boom")
    with pytest.raises(ValueError, match="boom"):
        await child.ask(Boom(error))
    return error


async def test_parent_hears_of_a_permanent_childs_failure_and_the_child_restarts() -> None:
    async with ActorTestKit() as kit:
        probe, child = await start(kit, "permanent")
        assert await child.ask(Get()) == 1
        error = await fail(child)
        signal = await probe.expect_message(ChildFailed)
        assert signal.ref == child
        assert signal.reason is error
        assert await child.ask(Get()) == 1  # a fresh instance behind the same ref
        await probe.expect_no_message(0.05)  # exactly once, and no Terminated


async def test_parent_hears_of_a_temporary_childs_failure_then_of_its_end() -> None:
    async with ActorTestKit() as kit:
        probe, child = await start(kit, "temporary", watch=True)
        error = await fail(child)
        assert await probe.expect_message(ChildFailed) == ChildFailed(child, error)
        assert await probe.expect_message(Terminated) == Terminated(child, error)
        await probe.expect_no_message(0.05)
        assert not child.is_alive


async def test_a_failed_restart_attempt_is_a_failure_of_its_own() -> None:
    FailsFirstRestart.restarts = 0
    async with ActorTestKit() as kit:
        probe, child = await start(kit, "permanent", child=FailsFirstRestart)
        error = await fail(child)
        assert (await probe.expect_message(ChildFailed)).reason is error
        second = await probe.expect_message(ChildFailed)
        assert isinstance(second.reason, RuntimeError)
        assert str(second.reason) == "restart failed"
        assert await child.ask(Get()) == 1  # the next attempt succeeded
        await probe.expect_no_message(0.05)


@pytest.mark.parametrize("restart", ["permanent", "temporary"])
async def test_no_signal_when_a_child_stops_itself(restart: RestartType) -> None:
    async with ActorTestKit() as kit:
        probe, child = await start(kit, restart, watch=True)
        await child.tell(StopYourself())
        if restart == "temporary":
            assert await probe.expect_message(Terminated) == Terminated(child, None)
        else:
            assert await child.ask(Get()) == 1  # a permanent one was restarted
        await probe.expect_no_message(0.05)


async def test_no_signal_when_a_child_is_stopped() -> None:
    async with ActorTestKit() as kit:
        probe, child = await start(kit, "permanent", watch=True)
        await kit.system.stop(child)
        assert await probe.expect_message(Terminated) == Terminated(child, None)
        await probe.expect_no_message(0.05)


async def test_a_parent_that_does_not_list_it_is_unaffected() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        await kit.spawn(CatchAll, probe.ref, name="p", props=Props(strategy=NO_BACKOFF))
        child: ActorRef[Any] = kit.system.lookup("p/child")
        await fail(child)
        assert await child.ask(Get()) == 1  # supervised as before
        await probe.expect_no_message(0.05)  # Actor[object] alone does not opt in
