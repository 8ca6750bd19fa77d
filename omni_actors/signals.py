"""Messages the runtime itself delivers to actors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_actors._ref import ActorRef

__all__ = ["Terminated"]


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
