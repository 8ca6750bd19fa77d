"""Fault injection for actor tests."""

from __future__ import annotations

import os
import signal
from typing import Any, TypeVar

from omni_actors._actor import Actor
from omni_actors._ref import ActorRef
from omni_actors.protocols.stage import StepChunks

__all__ = ["InjectedFault", "crash_after", "kill_worker", "worker_pid"]

A = TypeVar("A", bound=Actor[Any])


class InjectedFault(Exception):
    """The failure raised by :func:`crash_after`."""


def crash_after(
    actor_cls: type[A],
    messages: int,
    *,
    times: int | None = 1,
    error: type[Exception] = InjectedFault,
) -> type[A]:
    """A subclass of ``actor_cls`` whose instances raise on message ``messages + 1``.

    A step's chunks (``StepChunks``) count as that many messages, as each was once
    sent alone: the count does not depend on how a stage's sessions shared its turns.
    Each instance counts for itself, so a restarted actor handles ``messages`` more
    messages before it raises again. ``times`` caps how many crashes happen in total
    across restarts (``None``: no cap); afterwards the actor behaves normally.
    """
    if messages < 0:
        raise ValueError(f"messages must be >= 0, got {messages}")
    crashes = 0

    class Faulty(actor_cls):  # type: ignore[valid-type,misc]
        _handled = 0

        def _count(self, message: Any) -> None:
            nonlocal crashes
            weight = len(message.chunks) if isinstance(message, StepChunks) else 1
            if self._handled + weight > messages and (times is None or crashes < times):
                crashes += 1
                self._handled = 0
                raise error(f"injected fault in {type(self).__qualname__} after {messages}")
            self._handled += weight

        async def receive(self, message: Any) -> Any:
            self._count(message)
            return await super().receive(message)

        def receive_now(self, message: Any) -> Any:
            self._count(message)  # a message taken at once counts as one through receive
            return super().receive_now(message)

    Faulty.__name__ = Faulty.__qualname__ = f"Faulty{actor_cls.__name__}"
    return Faulty


def worker_pid(ref: ActorRef[Any]) -> int:
    """The pid of the worker process hosting ``ref`` (spawned with ``Props(process=True)``).

    Raises:
        ValueError: ``ref`` is a local actor, or its worker is not running right now.
    """
    from omni_actors.transport.process_placement import ProcessHost

    host = ref._cell.instance
    if not isinstance(host, ProcessHost):
        raise ValueError(f"{ref.path} is not a process actor (spawn it with Props(process=True))")
    if host.worker is None:
        raise ValueError(f"{ref.path} has no running worker (it is restarting or stopped)")
    return host.worker.proc.pid


def kill_worker(ref: ActorRef[Any], sig: int = signal.SIGKILL) -> int:
    """Kill the worker process hosting ``ref`` (default: SIGKILL, nothing runs in it).

    Its supervisor sees the actor fail with ``WorkerDiedError``. Returns the pid killed.
    """
    pid = worker_pid(ref)
    os.kill(pid, sig)
    return pid
