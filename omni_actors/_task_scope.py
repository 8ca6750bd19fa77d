"""``TaskScope``: the tasks an actor starts besides its own, owned by the actor.

Structured concurrency for actors: a task an actor starts (a stage's per-session task,
say) belongs to that actor's scope, ``self.context.tasks``. When the actor stops or
restarts, its cell cancels every task still in the scope and waits for them, up to the
system's ``stop_timeout``; a task that outlives that deadline is named in the log with
the reason, never dropped silently. A task that fails is logged as it ends: nothing
started here can fail unseen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["TaskScope"]

log = logging.getLogger("omni_actors")

T = TypeVar("T")

TaskFactory = Callable[..., "asyncio.Task[Any]"]


class TaskScope:
    """A set of tasks with one owner, which cancels and awaits them all when it ends.

    Args:
        owner: who owns the tasks (an actor's path), for the log.
        create_task: how a task is made (the actor system tracks its tasks, so a task
            that survives its scope still fails the test kit's leak check).
    """

    __slots__ = ("_create", "_tasks", "owner")

    def __init__(self, owner: str, create_task: TaskFactory | None = None) -> None:
        self.owner = owner
        self._create = create_task
        self._tasks: set[asyncio.Task[Any]] = set()

    def create_task(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Start ``coro`` as a task of this scope.

        The task is cancelled and awaited when the scope is cancelled (the actor stops
        or restarts); cancelling it earlier yourself is fine.
        """
        if self._create is not None:
            task: asyncio.Task[T] = self._create(coro, name=name)
        else:
            task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("task %r of %s failed", task.get_name(), self.owner, exc_info=error)

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def tasks(self) -> list[asyncio.Task[Any]]:
        """The tasks still running."""
        return [t for t in self._tasks if not t.done()]

    def cancel_now(self) -> None:
        """Request cancellation of every task without waiting (the owner was killed)."""
        for task in self._tasks:
            task.cancel()

    async def cancel(self, timeout: float, reason: str) -> list[asyncio.Task[Any]]:
        """Cancel every task and wait for them, ``timeout`` seconds at most.

        Returns the tasks still running at the deadline (each is logged with
        ``reason``); they stay referenced here, so a late one is still awaited by
        the system's shutdown.
        """
        tasks = self.tasks
        if not tasks:
            return []
        for task in tasks:
            task.cancel()
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        abandoned = sorted(pending, key=lambda t: t.get_name())
        for task in abandoned:
            log.error(
                "%s: task %r did not end within %gs of its cancellation (%s); it is "
                "abandoned. Whatever it awaits ignores cancellation: make it return "
                "promptly, or raise the system's stop_timeout",
                self.owner,
                task.get_name(),
                timeout,
                reason,
            )
        return abandoned
