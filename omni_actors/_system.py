"""``ActorSystem``: the root of an actor tree."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from omni_actors._actor import Actor
from omni_actors._cell import ActorCell
from omni_actors._mailbox import MailboxConfig
from omni_actors._props import Props
from omni_actors._ref import ActorRef
from omni_actors.clock import Clock, LoopClock
from omni_actors.errors import ActorNotFoundError, ActorStoppedError
from omni_actors.remoting import PlacedActor, placement_factory
from omni_actors.supervision import SupervisorStrategy

if TYPE_CHECKING:
    from omni_actors.remoting import Hosting, Placement

__all__ = ["ActorSystem", "run"]

log = logging.getLogger("omni_actors")

C = TypeVar("C")
T = TypeVar("T")

_DEFAULT_PROPS = Props()


class _Guardian(Actor[object]):
    """The root actor: parent of every top-level actor; accepts no user messages."""

    accepts = ()


class ActorSystem:
    """Spawns top-level actors, looks them up by path, and shuts the tree down in order.

    Use it as an async context manager::

        async with ActorSystem() as system:
            ref = await system.spawn(Counter, name="counter")
            await ref.tell(Increment())

    Args:
        name: a label for logs.
        strategy: how the root supervises top-level actors. If the root's restart
            intensity is exceeded the whole system terminates (see ``wait_terminated``).
        clock: time source for backoff and intensity (tests pass a ``VirtualClock``).
        stop_timeout: per-actor deadline for a graceful stop before it is killed.
        seed: seeds the backoff jitter, for reproducible runs.
    """

    def __init__(
        self,
        name: str = "omni",
        *,
        strategy: SupervisorStrategy | None = None,
        clock: Clock | None = None,
        stop_timeout: float = 5.0,
        seed: int | None = None,
    ) -> None:
        self.name = name
        self.clock: Clock = clock or LoopClock()
        self.stop_timeout = stop_timeout
        self.rng = random.Random(seed)
        self._strategy = strategy or SupervisorStrategy()
        self._registry: dict[str, ActorCell] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._guardian: ActorCell | None = None
        self._placements: dict[str, Placement] = {}

    async def __aenter__(self) -> ActorSystem:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    async def start(self) -> None:
        """Start the root actor; ``async with`` does this for you."""
        if self._guardian is not None:
            return
        guardian = ActorCell(
            self, None, "", _Guardian, (), {}, "temporary", self._strategy, MailboxConfig()
        )
        self._guardian = guardian
        guardian.task = self._create_task(guardian._run(), name="actor /")
        await guardian.started

    @property
    def _root(self) -> ActorCell:
        guardian = self._guardian
        if guardian is None:
            raise RuntimeError("ActorSystem is not started; use 'async with ActorSystem()'")
        if guardian.state.ending:
            raise ActorStoppedError(f"system {self.name}", "it has shut down")
        return guardian

    async def spawn(
        self,
        actor_cls: type[Actor[C]],
        *args: Any,
        name: str | None = None,
        props: Props = _DEFAULT_PROPS,
        **kwargs: Any,
    ) -> ActorRef[C]:
        """Start a top-level actor and return its ref once ``on_start`` has finished.

        ``args`` and ``kwargs`` go to the actor's constructor, which is called again on
        every restart.

        Args:
            actor_cls: the ``Actor`` subclass.
            name: unique among siblings (generated if omitted); the path is ``/name``.
            props: how to run it — mailbox, supervision, restart type, process
                placement, start deadline (see :class:`~omni_actors.Props`).

        Raises:
            Exception: whatever ``on_start`` raised (the actor is not started).
            StartTimeoutError: ``on_start`` took longer than ``props.start_timeout``.
            ActorNameTakenError: the name is in use.
        """
        return await self._root.spawn_child(actor_cls, args, kwargs, name=name, props=props)

    def lookup(self, path: str) -> ActorRef[Any]:
        """The live actor at ``path`` (``"name"``, ``"/parent/child"``).

        Raises:
            ActorNotFoundError: nothing live is registered there.
        """
        key = "/" + path.strip("/")
        try:
            return self._registry[key].ref
        except KeyError:
            raise ActorNotFoundError(f"no live actor at {key!r}") from None

    async def stop(self, ref: ActorRef[Any], timeout: float | None = None) -> None:
        """Stop ``ref`` (and its children) and wait until it has stopped."""
        await ref._cell.stop(self.stop_timeout if timeout is None else timeout)

    async def shutdown(self) -> None:
        """Stop every actor, newest top-level first, each child before its parent.

        Each actor gets ``stop_timeout`` seconds to finish its current message and
        ``on_stop`` before it is killed. Returns once every actor task has ended.
        """
        guardian = self._guardian
        if guardian is None:
            return
        await guardian.stop(self.stop_timeout)
        placements, self._placements = self._placements, {}
        for placement in placements.values():
            await placement.close()
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=self.stop_timeout)
            for task in stuck:
                log.error("actor task %s is still running after shutdown", task.get_name())

    async def wait_terminated(self) -> BaseException | None:
        """Wait until the system has terminated; returns why (None after ``shutdown``)."""
        if self._guardian is None:
            raise RuntimeError("ActorSystem is not started")
        return await asyncio.shield(self._guardian.terminated)

    @property
    def is_terminated(self) -> bool:
        """True once the root actor has stopped (after shutdown or a root escalation)."""
        return self._guardian is not None and self._guardian.terminated.done()

    # -- runtime internals used by cells --------------------------------------------

    def _create_task(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _place(self, kind: str, actor: PlacedActor) -> Hosting:
        """How placement ``kind`` hosts ``actor`` (the placement is built on first use)."""
        placement = self._placements.get(kind)
        if placement is None:
            placement = placement_factory(kind)(self)
            self._placements[kind] = placement
        return await placement.place(actor)

    def placement_counts(self) -> dict[str, int]:
        """What the placements in use count (a placement with a ``counts()``: for the
        ``process`` one, frames refused and messages lost with dead workers), summed."""
        totals: dict[str, int] = {}
        for placement in self._placements.values():
            counts = getattr(placement, "counts", None)
            for name, n in (counts() if counts is not None else {}).items():
                totals[name] = totals.get(name, 0) + n
        return totals

    def _register(self, cell: ActorCell) -> None:
        self._registry[cell.path] = cell

    def _unregister(self, cell: ActorCell) -> None:
        if self._registry.get(cell.path) is cell:
            del self._registry[cell.path]


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when it is installed, else on the default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result
