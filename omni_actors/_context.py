"""``ActorContext``: an actor's handle on the runtime (``self.context`` inside an actor)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from omni_actors._props import Props
from omni_actors._state import CellState
from omni_actors.clock import Clock
from omni_actors.errors import ActorNotFoundError
from omni_actors.signals import Terminated

if TYPE_CHECKING:
    from omni_actors._actor import Actor
    from omni_actors._cell import ActorCell
    from omni_actors._ref import ActorRef
    from omni_actors._system import ActorSystem
    from omni_actors._task_scope import TaskScope

__all__ = ["ActorContext"]

M = TypeVar("M")
C = TypeVar("C")

_DEFAULT_PROPS = Props()


class ActorContext(Generic[M]):
    """What an actor can do besides receiving: spawn, watch, stop, look itself up."""

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def self_ref(self) -> ActorRef[M]:
        """This actor's own ref (stable across restarts)."""
        return self._cell.ref

    @property
    def parent(self) -> ActorRef[Any] | None:
        """The supervising actor's ref; ``None`` only for the system's root."""
        parent = self._cell.parent
        return None if parent is None or parent.parent is None else parent.ref

    @property
    def system(self) -> ActorSystem:
        """The actor system this actor lives in."""
        return self._cell.system

    @property
    def clock(self) -> Clock:
        """The system's clock (virtual under ``ActorTestKit(virtual_time=True)``)."""
        return self._cell.system.clock

    @property
    def tasks(self) -> TaskScope:
        """Where this actor starts tasks besides its own: each is cancelled and awaited
        when the actor stops or restarts (see :class:`omni_actors.TaskScope`)."""
        return self._cell.tasks

    @property
    def path(self) -> str:
        """This actor's path, e.g. ``/pipeline/thinker``."""
        return self._cell.path

    @property
    def children(self) -> list[ActorRef[Any]]:
        """Live children in start order."""
        return [child.ref for child in self._cell.children.values()]

    def child(self, name: str) -> ActorRef[Any]:
        """The live child called ``name``; raises ``ActorNotFoundError`` otherwise."""
        try:
            return self._cell.children[name].ref
        except KeyError:
            raise ActorNotFoundError(f"{self._cell.path} has no child named {name!r}") from None

    def child_state(self, child: ActorRef[Any]) -> CellState:
        """Where one of this actor's children is in its life.

        A supervisor is the one that knows whether a child is serving or being
        restarted (``SUSPENDED`` from its failure until its new instance has started,
        backoff included); a parent reports it as its children's health.

        Raises:
            ValueError: ``child`` is not a child of this actor.
        """
        cell = child._cell
        if cell.parent is not self._cell:
            raise ValueError(f"{child.path} is not a child of {self._cell.path}")
        return cell.state

    async def spawn(
        self,
        actor_cls: type[Actor[C]],
        *args: Any,
        name: str | None = None,
        props: Props = _DEFAULT_PROPS,
        **kwargs: Any,
    ) -> ActorRef[C]:
        """Start a child supervised by this actor; see ``ActorSystem.spawn``."""
        return await self._cell.spawn_child(actor_cls, args, kwargs, name=name, props=props)

    def watch(self, ref: ActorRef[Any]) -> None:
        """Receive ``Terminated(ref, reason)`` once ``ref`` stops for good.

        Raises:
            TypeError: this actor does not list ``Terminated`` in its message union.
        """
        cell = self._cell
        if not any(issubclass(Terminated, t) for t in cell.accepts):
            raise TypeError(
                f"actor {cell.path} watches {ref.path} but does not accept Terminated; "
                "add Terminated to its Actor[...] union"
            )
        target = ref._cell
        if target.terminated.done():
            cell.mailbox.push_system(Terminated(ref, target.terminated.result()))
            return
        target.watchers.add(cell)
        cell.watching.add(target)

    def unwatch(self, ref: ActorRef[Any]) -> None:
        """Stop watching ``ref``; a no-op if not watching."""
        ref._cell.watchers.discard(self._cell)
        self._cell.watching.discard(ref._cell)

    async def stop(self, child: ActorRef[Any], timeout: float | None = None) -> None:
        """Stop one of this actor's children and wait until it has stopped."""
        cell = child._cell
        if cell.parent is not self._cell:
            raise ValueError(f"{child.path} is not a child of {self._cell.path}")
        await cell.stop(self._cell.system.stop_timeout if timeout is None else timeout)

    def stop_self(self) -> None:
        """Stop after the current message (a ``permanent`` actor is then restarted)."""
        self._cell.stop_requested = True
