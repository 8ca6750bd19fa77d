"""Escalation keeps its reason even when the supervisor is busy asking the child."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from omni_actors import (
    Actor,
    ActorStoppedError,
    Backoff,
    Props,
    RestartIntensityExceededError,
    SupervisorStrategy,
)
from omni_actors.testing import ActorTestKit


@dataclass
class Work:
    pass


class Crashes(Actor[Work]):
    async def receive(self, message: Work) -> None:
        raise ValueError("engine fault")


class Slow(Actor[Work]):
    def __init__(self, entered: asyncio.Event | None = None) -> None:
        self.entered = entered or asyncio.Event()

    async def receive(self, message: Work) -> None:
        self.entered.set()
        await asyncio.sleep(30)  # the behaviour under test: a receive that takes long


class Busy(Actor[Work]):
    """Tells one child (which fails), then waits on an ask to the other one."""

    supervisor_strategy = SupervisorStrategy(
        max_restarts=0, backoff=Backoff(min_s=0.0, max_s=0.0, jitter=0.0)
    )

    async def on_start(self) -> None:
        self.crashes = await self.context.spawn(
            Crashes, name="crashes", props=Props(restart="permanent")
        )
        self.slow = await self.context.spawn(Slow, name="slow", props=Props(restart="permanent"))

    async def receive(self, message: Work) -> None:
        await self.crashes.tell(message)
        # Escalation stops ``slow`` while this ask waits: it raises ActorStoppedError,
        # which must not replace the real reason.
        await self.slow.ask(message, timeout=10.0)


async def test_a_busy_supervisor_escalates_with_the_intensity_error() -> None:
    async with ActorTestKit(stop_timeout=0.2) as kit:
        probe = await kit.create_probe()
        busy = await kit.spawn(Busy, name="busy")
        probe.watch(busy)
        await busy.tell(Work())
        terminated = await probe.expect_terminated(busy, timeout=5)
        assert isinstance(terminated.reason, RestartIntensityExceededError)
        assert isinstance(terminated.reason.__cause__, ValueError)


async def test_an_ask_in_flight_fails_at_once_when_its_actor_is_killed() -> None:
    async with ActorTestKit(stop_timeout=0.05) as kit:
        entered = asyncio.Event()
        slow = await kit.spawn(Slow, entered, name="slow")
        pending = asyncio.ensure_future(slow.ask(Work(), timeout=30))
        await kit.eventually(entered.is_set, what="the ask is being received")
        await kit.system.stop(slow)  # graceful stop times out, then the actor is killed
        with pytest.raises(ActorStoppedError, match="before replying"):
            await asyncio.wait_for(pending, 1.0)  # not the ask's 30 s deadline


class StubbornStart(Actor[Work]):
    """Ignores the first cancellation of its on_start, then finishes starting."""

    def __init__(self, started: asyncio.Event) -> None:
        self.started = started

    async def on_start(self) -> None:
        # The behaviour under test: a start that outlives its deadline, then completes.
        try:
            await asyncio.sleep(30)  # cancelled by the start timeout
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # ...which it ignores, to finish late
        self.started.set()


async def test_a_start_timeout_never_leaves_the_actor_running() -> None:
    from omni_actors import ActorNotFoundError, StartTimeoutError

    async with ActorTestKit(stop_timeout=0.01) as kit:
        started = asyncio.Event()
        with pytest.raises(StartTimeoutError):
            await kit.system.spawn(
                StubbornStart, started, name="stubborn", props=Props(start_timeout=0.05)
            )
        await kit.eventually(started.is_set, what="on_start has finished")
        await kit.eventually(lambda: not kit.is_alive("/stubborn"))
        with pytest.raises(ActorNotFoundError):
            kit.system.lookup("stubborn")
