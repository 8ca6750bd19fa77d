"""``ActorContext.child_state``: a parent sees whether a child serves or is being restarted.

The supervisor knows it before anyone else: from the child's failure until its new
instance has started (the backoff included) the child is ``SUSPENDED``; a parent that
reports its children's health (the orchestrator, for ``/readyz``) reads it here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from omni_actors import (
    Actor,
    ActorRef,
    Backoff,
    CellState,
    Props,
    SupervisorStrategy,
)
from omni_actors.testing import ActorTestKit, eventually


@dataclass(frozen=True)
class Boom:
    pass


@dataclass(frozen=True)
class StateOf:
    ref: ActorRef[Boom]


class Child(Actor[Boom]):
    async def receive(self, message: Boom) -> None:
        raise ValueError("boom")


class Parent(Actor[StateOf]):
    """Spawns ``child``; answers where a given actor is in its life."""

    async def on_start(self) -> None:
        await self.context.spawn(Child, name="child", props=Props(restart="permanent"))

    async def receive(self, message: StateOf) -> CellState:
        return self.context.child_state(message.ref)


async def test_a_child_is_suspended_from_its_failure_until_its_restart() -> None:
    backoff = Backoff(min_s=10.0, max_s=10.0, jitter=0.0)
    async with ActorTestKit(virtual_time=True) as kit:
        clock = kit.virtual_clock
        parent = await kit.spawn(
            Parent, name="p", props=Props(strategy=SupervisorStrategy(backoff=backoff))
        )
        child: ActorRef[Boom] = kit.system.lookup("p/child")
        assert await parent.ask(StateOf(child)) is CellState.RUNNING

        with pytest.raises(ValueError, match="boom"):
            await child.ask(Boom())
        await eventually(clock.pending)  # the restart waits for its backoff
        assert await parent.ask(StateOf(child)) is CellState.SUSPENDED

        clock.advance(10.0)

        async def running() -> bool:
            return await parent.ask(StateOf(child)) is CellState.RUNNING

        await eventually(running)


async def test_only_a_parent_may_ask() -> None:
    async with ActorTestKit() as kit:
        parent = await kit.spawn(Parent, name="p")
        other = await kit.spawn(Child, name="other")
        with pytest.raises(ValueError, match="is not a child of"):
            await parent.ask(StateOf(other))
