"""Messages the runtime itself delivers to actors, and the marker for urgent ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_actors._ref import ActorRef

__all__ = ["ChildFailed", "ControlMessage", "Terminated"]


class ControlMessage:
    """Mixin marking a user message as urgent: it overtakes the actor's queued messages.

    As with Akka's control-aware mailboxes, a message whose type subclasses this one
    travels in the mailbox's system lane, so it is handled before every queued user
    message and is never refused for lack of room (no backpressure wait, no overflow
    policy, no credit across processes): "abort this request" must not queue behind the
    very work it cancels. Otherwise it is an ordinary message: the actor must list its
    type, ``receive`` handles it, an ``ask`` gets the reply, and a failure is supervised
    as usual. While the actor restarts it is stashed ahead of the user messages.

    Keep such messages rare and small, since nothing bounds them. It has no fields and
    empty ``__slots__``, so it mixes into dataclasses and ``msgspec.Struct`` alike::

        class Abort(msgspec.Struct, ControlMessage, tag=True):
            request_id: str
    """

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Terminated:
    """A watched actor has stopped for good.

    Delivered to every watcher (see ``ActorContext.watch``) through its system lane, so a
    full mailbox never delays it. A watcher must list ``Terminated`` in its message union.

    Attributes:
        ref: the actor that stopped.
        reason: ``None`` after a normal stop, else the failure that stopped it.
    """

    ref: ActorRef[Any]
    reason: BaseException | None


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """A child of this actor failed; its supervisor handles it as usual.

    Supervision decides what happens to the child, but the parent often needs to know
    too (e.g. to fail the requests it had routed there). A parent opts in by listing
    ``ChildFailed`` itself in its message union (``Actor[object]`` does not count, so a
    catch-all actor is not surprised); it then gets one per failure — ``receive`` raised,
    a resource it depends on died (``WorkerDiedError`` for a process actor), a restart
    attempt failed, or its own children escalated — through its system lane, whatever the
    supervisor then decides (restart, stop, escalation). Delivery is not ordered with the
    restart. A child that stops normally, or stops itself, sends none; watch it for
    ``Terminated``.

    Attributes:
        ref: the child that failed (still valid if it is restarted).
        reason: the failure.
    """

    ref: ActorRef[Any]
    reason: BaseException
