"""Taking a message at once: ``Actor.receive_now`` run inside the sender's ``tell``.

A stage's chunk wakes the receiving actor's task, which then hands the chunk on and
parks again: on a loop moving thousands of chunks a second, those wake-ups are a large
part of the CPU per chunk. An actor that declares ``receives_now`` takes such a message
synchronously in the sender's task *when it is idle* — its task parked on an empty
mailbox, nothing stashed, not restarting or stopping — because the message would then
have been the next one handled anyway: the order of messages is the mailbox's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from omni_actors import _system_messages as sm
from omni_actors._state import CellState

if TYPE_CHECKING:
    from omni_actors._actor import Actor
    from omni_actors._cell import ActorCell
    from omni_actors._mailbox import ReplySink

__all__ = ["Rest", "take_now"]

_RUNNING = CellState.RUNNING  # a module constant: read once per message


class Rest:
    """The rest of a message an idle actor took at once, queued for its own task; it
    belongs to the instance that took the message (a restarted one skips it)."""

    __slots__ = ("instance", "rest")

    def __init__(self, instance: Actor[Any], rest: Callable[[], Awaitable[None]]) -> None:
        self.instance = instance
        self.rest = rest


def take_now(cell: ActorCell, message: object, reply: ReplySink | None) -> bool:
    """Hand ``message`` to ``cell``'s idle actor; False if it must take the mailbox: not
    one of its ``receives_now`` types, or the actor is busy, has messages waiting, is
    restarting or stopping.

    What ``receive_now`` raises fails the actor through the system lane, as a failure
    of ``receive`` does (and ``reply``, if any, gets the exception); the rest it returns
    is queued first in the (empty) mailbox, so it runs before any later message.
    """
    mailbox = cell.mailbox
    if (
        type(message) not in cell.receives_now
        or cell.state is not _RUNNING
        or cell.stop_requested
        or cell.stash
        or not mailbox.idle
    ):
        return False
    instance = cell.instance
    assert instance is not None
    try:
        rest = instance.receive_now(message)
    except Exception as exc:
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        mailbox.push_system(sm.Fail(exc))  # handled next, as receive's failure is
        return True
    if rest is not None:
        mailbox.push_remote((Rest(instance, rest), reply))  # the mailbox was empty
    elif reply is not None and not reply.done():
        reply.set_result(None)
    return True
