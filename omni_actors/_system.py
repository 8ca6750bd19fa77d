"""``ActorSystem``: the root of an actor tree."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from omni_actors._actor import Actor
from omni_actors._cell import ActorCell
from omni_actors._mailbox import Mailbox, MailboxConfig
from omni_actors._ref import ActorRef
from omni_actors.clock import Clock, LoopClock
from omni_actors.errors import ActorNotFoundError, ActorStoppedError
from omni_actors.supervision import RestartType, SupervisorStrategy

if TYPE_CHECKING:
    from omni_actors.transport.workers import Workers

__all__ = ["ActorSystem", "run"]

log = logging.getLogger("omni_actors")

C = TypeVar("C")
T = TypeVar("T")


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
        self._workers: Workers | None = None

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
        if guardian.state in ("stopping", "stopped"):
            raise ActorStoppedError(f"system {self.name}", "it has shut down")
        return guardian

    async def spawn(
        self,
        actor_cls: type[Actor[C]],
        *args: Any,
        name: str | None = None,
        restart: RestartType = "temporary",
        strategy: SupervisorStrategy | None = None,
        mailbox: MailboxConfig | None = None,
        start_timeout: float = 30.0,
        process: bool = False,
        **kwargs: Any,
    ) -> ActorRef[C]:
        """Start a top-level actor and return its ref once ``on_start`` has finished.

        ``args`` and ``kwargs`` go to the actor's constructor, which is called again on
        every restart.

        Args:
            actor_cls: the ``Actor`` subclass.
            name: unique among siblings (generated if omitted); the path is ``/name``.
            restart: ``permanent``, ``transient`` or ``temporary`` (default: a failure
                stops the actor).
            strategy: how this actor supervises its own children (default: the class's
                ``supervisor_strategy``).
            mailbox: overrides the class's ``mailbox`` settings.
            start_timeout: deadline for ``on_start`` (for a process actor: for the worker
                to start and the actor's ``on_start`` in it).
            process: run the actor in its own worker process. Its class must live in an
                importable module, its constructor arguments and messages must be
                msgspec-encodable (messages: ``msgspec.Struct``s, tensors allowed), and
                the returned ref behaves exactly like a local one; if the process dies,
                the actor fails and its supervisor decides (a restart starts a fresh
                worker; tells the dead worker had not processed are lost, asks fail).
                Overflow ``drop_oldest`` cannot recall sent messages, so it waits like
                ``backpressure``.

        Raises:
            Exception: whatever ``on_start`` raised (the actor is not started).
            StartTimeoutError: ``on_start`` took longer than ``start_timeout``.
            ActorNameTakenError: the name is in use.
        """
        return await self._root.spawn_child(
            actor_cls,
            args,
            kwargs,
            name=name,
            restart=restart,
            strategy=strategy,
            mailbox=mailbox,
            start_timeout=start_timeout,
            process=process,
        )

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
        if self._workers is not None:
            await self._workers.close()
            self._workers = None
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

    async def _process_actor(
        self,
        path: str,
        actor_cls: type[Actor[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        config: MailboxConfig,
    ) -> tuple[Mailbox, Callable[[], Actor[Any]]]:
        """The mailbox and host factory of an actor that runs in a worker process."""
        # Imported here so that processes without workers never load ZeroMQ.
        from omni_actors.transport.remote import RemoteMailbox
        from omni_actors.transport.workers import ProcessHost, Workers, actor_spec

        actor_spec(actor_cls)  # fail fast if a worker could not import the class
        if self._workers is None:
            self._workers = Workers(self)
            await self._workers.start()
        workers = self._workers
        mailbox = RemoteMailbox(path, config, actor_cls.replies)
        return mailbox, lambda: ProcessHost(workers, actor_cls, args, kwargs, mailbox)

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
