"""``ActorTestKit``: an actor system for one test, torn down and checked after it."""

from __future__ import annotations

from typing import Any, TypeVar

from omni_actors._actor import Actor
from omni_actors._props import Props
from omni_actors._ref import ActorRef
from omni_actors._system import ActorSystem
from omni_actors.supervision import SupervisorStrategy
from omni_actors.testing.clock import VirtualClock
from omni_actors.testing.probe import TestProbe

__all__ = ["ActorTestKit"]

C = TypeVar("C")

_DEFAULT_PROPS = Props()


class ActorTestKit:
    """An ``ActorSystem`` for a test.

    On exit it shuts the system down and fails the test if any actor task is still
    running, so leaks surface where they happen.

    Args:
        virtual_time: drive supervision (backoff, intensity) with a :class:`VirtualClock`
            available as :attr:`clock`.
        strategy: the root's supervisor strategy.
        stop_timeout: per-actor stop deadline during shutdown.
        seed: backoff jitter seed (deterministic by default).
    """

    def __init__(
        self,
        *,
        virtual_time: bool = False,
        strategy: SupervisorStrategy | None = None,
        stop_timeout: float = 2.0,
        seed: int = 0,
    ) -> None:
        self.clock: VirtualClock | None = VirtualClock() if virtual_time else None
        self.system = ActorSystem(
            "testkit", strategy=strategy, clock=self.clock, stop_timeout=stop_timeout, seed=seed
        )

    async def __aenter__(self) -> ActorTestKit:
        await self.system.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    async def shutdown(self) -> None:
        """Shut the system down and assert that no actor task survived it."""
        await self.system.shutdown()
        leaked = [t.get_name() for t in self.system._tasks if not t.done()]
        if leaked:
            raise AssertionError(f"actor tasks still running after shutdown: {leaked}")

    @property
    def virtual_clock(self) -> VirtualClock:
        """The virtual clock (only with ``virtual_time=True``)."""
        if self.clock is None:
            raise RuntimeError("ActorTestKit(virtual_time=True) is needed for a virtual clock")
        return self.clock

    async def spawn(
        self,
        actor_cls: type[Actor[C]],
        *args: Any,
        name: str | None = None,
        props: Props = _DEFAULT_PROPS,
        **kwargs: Any,
    ) -> ActorRef[C]:
        """Spawn a top-level actor in the test's system (see ``ActorSystem.spawn``)."""
        return await self.system.spawn(actor_cls, *args, name=name, props=props, **kwargs)

    async def create_probe(self, name: str | None = None) -> TestProbe:
        """A new :class:`TestProbe` in this system."""
        return await TestProbe.start(self.system, name)
