"""``ActorTestKit``: an actor system for one test, torn down and checked after it."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from omni_actors._actor import Actor
from omni_actors._props import Props
from omni_actors._ref import ActorRef
from omni_actors._system import ActorSystem
from omni_actors.supervision import SupervisorStrategy
from omni_actors.testing import inspection
from omni_actors.testing.clock import VirtualClock
from omni_actors.testing.probe import TestProbe
from omni_actors.testing.waiting import Condition, consistently, eventually

__all__ = ["ActorTestKit"]

C = TypeVar("C")
T = TypeVar("T")

_DEFAULT_PROPS = Props()


class ActorTestKit:
    """An ``ActorSystem`` for a test.

    On exit it shuts the system down and fails the test if any actor task is still
    running, so leaks surface where they happen. Besides spawning, it waits on
    conditions (:meth:`eventually`, :meth:`consistently`: never sleep in a test) and
    shows what a test may read of its actors (:meth:`instance`, :meth:`mailbox_depth`,
    :meth:`live_tasks`, ...) without touching the runtime's private attributes.

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
        leaked = [t.get_name() for t in self.live_tasks()]
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

    # -- waiting ----------------------------------------------------------------------

    async def eventually(self, condition: Condition[T], timeout: float = 5.0, what: str = "") -> T:
        """Wait until ``condition()`` holds; see :func:`omni_actors.testing.eventually`."""
        return await eventually(condition, timeout, what)

    async def consistently(
        self, condition: Condition[object], duration: float = 0.1, what: str = ""
    ) -> None:
        """Assert ``condition()`` keeps holding; see
        :func:`omni_actors.testing.consistently`."""
        await consistently(condition, duration, what)

    async def armed(self, delay: float, count: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``count`` deadlines are armed ``delay`` virtual seconds from now.

        Virtual time moves only when the test says so, and a deadline armed after
        :meth:`VirtualClock.advance` has run is not moved by it: a test that advances
        past a deadline first waits until the wait it guards has begun (a response's
        ``first_chunk_s`` is armed once the engine has taken its input, not when
        ``respond()`` returns)::

            response = await session.respond()
            await kit.armed(6.0)  # deadlines.first_chunk_s
            kit.virtual_clock.advance(6.0)

        Raises:
            AssertionError: they were not armed within ``timeout`` real seconds; the
                message lists the deadlines that are.
        """
        clock = self.virtual_clock

        def ready() -> bool:
            pending = clock.pending()
            armed = sum(1 for d in pending if abs(d - delay) < 1e-9)
            assert armed >= count, f"armed now, seconds from now: {pending}"
            return True

        await self.eventually(ready, timeout, what=f"{count} deadline(s) {delay}s away")

    # -- what a test may read ----------------------------------------------------------

    def live_tasks(self) -> list[asyncio.Task[Any]]:
        """The system's tasks still running: actors' own and their task scopes'."""
        return inspection.live_tasks(self.system)

    def live_actors(self) -> list[str]:
        """Paths of every live actor, sorted."""
        return inspection.live_actor_paths(self.system)

    def is_alive(self, target: str | ActorRef[Any]) -> bool:
        """Whether an actor lives at ``target`` (a path such as ``"/parent/child"``, or
        a ref: a restarting actor is alive)."""
        if isinstance(target, ActorRef):
            return target.is_alive
        return "/" + target.strip("/") in self.live_actors()

    def instance(self, ref: ActorRef[Any]) -> Actor[Any] | None:
        """The actor instance behind ``ref`` now; see
        :func:`omni_actors.testing.inspection.actor_instance`."""
        return inspection.actor_instance(ref)

    def mailbox_depth(self, ref: ActorRef[Any], lane: inspection.Lane = "user") -> int:
        """Messages queued in one lane (``user`` or ``system``) of ``ref``'s mailbox."""
        return inspection.mailbox_depth(ref, lane)

    def queued_messages(self, ref: ActorRef[Any]) -> list[object]:
        """The user messages queued for ``ref``, oldest first."""
        return inspection.queued_messages(ref)

    def stashed_messages(self, ref: ActorRef[Any]) -> list[object]:
        """Messages ``ref`` set aside while restarting, to be replayed first."""
        return inspection.stashed_messages(ref)

    def mailbox_room(self, ref: ActorRef[Any]) -> int:
        """How many more user messages ``ref``'s mailbox takes before senders wait."""
        return inspection.mailbox_room(ref)

    def blocked_senders(self, ref: ActorRef[Any]) -> int:
        """Senders waiting for room in ``ref``'s mailbox."""
        return inspection.blocked_senders(ref)

    async def terminated(self, ref: ActorRef[Any], timeout: float = 5.0) -> BaseException | None:
        """Wait until ``ref`` has terminated; return why (``None``: stopped normally)."""
        return await inspection.terminated(ref, timeout)
