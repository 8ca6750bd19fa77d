"""Messages the runtime itself delivers to actors, and the marker for urgent ones.

:class:`ControlMessage` is defined with the protocols (``omni_actors.protocols.message``),
which must not import the runtime, and is re-exported here and from ``omni_actors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_actors._ref import ActorRef

__all__ = ["ChildFailed", "Terminated"]


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
