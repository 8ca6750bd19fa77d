"""What a test may read of a running actor, without touching the runtime's internals.

Tests assert on state that no message reports — the instance behind a ref, what waits
in its mailbox, how it terminated, which tasks are still running. These functions are
that view, kept in one place so that tests depend on a documented surface and the
kernel stays free to change its internals. :class:`ActorTestKit` offers them as methods
too. They read local actors (an actor in a worker process is represented here by its
local stand-in).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

from omni_actors._actor import Actor
from omni_actors._ref import ActorRef

if TYPE_CHECKING:
    from omni_actors._system import ActorSystem

Lane = Literal["user", "system"]

__all__ = [
    "Lane",
    "actor_instance",
    "actor_task",
    "blocked_senders",
    "live_actor_paths",
    "live_tasks",
    "mailbox_depth",
    "mailbox_room",
    "queued_messages",
    "stashed_messages",
    "terminated",
    "watched_by",
]


def actor_instance(ref: ActorRef[Any]) -> Actor[Any] | None:
    """The actor instance behind ``ref`` right now (a new one after each restart);
    ``None`` while it is restarting or once it has stopped."""
    return ref._cell.instance


def actor_task(ref: ActorRef[Any]) -> asyncio.Task[None] | None:
    """The task that runs ``ref``'s actor (``None`` before it was started)."""
    return ref._cell.task


def mailbox_depth(ref: ActorRef[Any], lane: Lane = "user") -> int:
    """Messages queued in one lane of ``ref``'s mailbox, not yet received.

    ``user``: ordinary messages. ``system``: what is served first — stop, restart,
    ``Terminated``, and control messages (``ControlMessage``).
    """
    box = ref._cell.mailbox
    return len(box.user if lane == "user" else box.system)


def queued_messages(ref: ActorRef[Any]) -> list[object]:
    """The user messages queued in ``ref``'s mailbox, oldest first."""
    return [message for message, _ in ref._cell.mailbox.user]


def stashed_messages(ref: ActorRef[Any]) -> list[object]:
    """Messages ``ref``'s actor set aside while it was not running (restarting): they
    are replayed, in order, before its mailbox once it runs again."""
    return [message for message, _ in ref._cell.stash]


def mailbox_room(ref: ActorRef[Any]) -> int:
    """How many more user messages ``ref`` takes before senders wait: free slots of a
    local mailbox; for an actor in a worker process, the credits its worker granted."""
    box = ref._cell.mailbox
    credits = getattr(box, "credits", None)  # a worker's actor: flow control by credit
    return box.room if credits is None else int(credits)


def blocked_senders(ref: ActorRef[Any]) -> int:
    """Senders waiting for room in ``ref``'s mailbox (backpressure)."""
    return ref._cell.mailbox.waiting_senders


def watched_by(ref: ActorRef[Any]) -> list[str]:
    """Paths of the actors ``ref``'s actor watches."""
    return sorted(cell.path for cell in ref._cell.watching)


async def terminated(ref: ActorRef[Any], timeout: float = 5.0) -> BaseException | None:
    """Wait until ``ref``'s actor has terminated; return why (``None``: a normal stop).

    Raises:
        TimeoutError: it is still running after ``timeout`` seconds.
    """
    async with asyncio.timeout(timeout):
        return await asyncio.shield(ref._cell.terminated)


def live_actor_paths(system: ActorSystem) -> list[str]:
    """Paths of every live actor of ``system``, sorted."""
    return sorted(system._registry)


def live_tasks(system: ActorSystem) -> list[asyncio.Task[Any]]:
    """The runtime's tasks of ``system`` still running: actors' own and their scopes'."""
    return [task for task in system._tasks if not task.done()]
