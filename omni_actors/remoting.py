"""What the kernel offers a transport: the one door between actors and the wire.

The kernel knows nothing of processes or sockets, and a transport touches nothing
private of the kernel; they meet here. A transport (``omni_actors.transport`` is one)
uses three things:

- **Placements** host an actor elsewhere. ``Props(process=True)`` names the placement
  kind ``"process"``; the kernel looks the kind up among those registered with
  :func:`register_placement` and asks it for a :class:`Hosting` — the mailbox that
  forwards the actor's user messages, and the local stand-in actor that keeps the
  remote one alive. The cell, its ref, ``watch`` and supervision stay local and
  unchanged. ``omni_actors/__init__`` registers the transport's process placement (it
  is imported on first use, so a program without process actors never loads ZeroMQ).
- **Inboxes** receive what arrives from the wire: :func:`inbox` finds the live local
  actor at a path, :meth:`Inbox.deliver` queues an envelope the way the kernel would
  (a ``ControlMessage`` on the system lane, anything else regardless of room, since the
  sender held a credit for it).
- **Refs to remote actors**: :class:`RemoteActor` is what an ``ActorRef`` to an actor on
  another node stands for; :func:`mailbox_of`, :func:`terminated` and :func:`fail`
  read or act on the actor behind a ref.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from omni_actors import _system_messages as sm
from omni_actors._mailbox import Envelope, Mailbox, MailboxConfig, ReplySink
from omni_actors._ref import ActorRef
from omni_actors.protocols.message import ControlMessage
from omni_actors.signals import Terminated

if TYPE_CHECKING:
    from omni_actors._actor import Actor
    from omni_actors._cell import ActorCell
    from omni_actors._system import ActorSystem
    from omni_actors.protocols.address import ActorAddress

__all__ = [
    "Envelope",
    "Hosting",
    "Inbox",
    "Mailbox",
    "MailboxConfig",
    "PlacedActor",
    "Placement",
    "PlacementFactory",
    "RemoteActor",
    "ReplySink",
    "fail",
    "in_process",
    "inbox",
    "mailbox_of",
    "placement_factory",
    "register_placement",
    "terminated",
]


@dataclass(frozen=True, slots=True)
class PlacedActor:
    """An actor to host elsewhere, as ``spawn`` was asked for it.

    Attributes:
        path: its path in this system (the local cell's).
        actor_cls: the ``Actor`` subclass to run there.
        args: positional constructor arguments.
        kwargs: keyword constructor arguments.
        mailbox: its mailbox settings (``Props.mailbox`` or the class's).
        host: ``Props.host``: where the placement should run it (its own type).
    """

    path: str
    actor_cls: type[Actor[Any]]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    mailbox: MailboxConfig
    host: Any = None


@dataclass(frozen=True, slots=True)
class Hosting:
    """How a placement hosts one actor.

    Attributes:
        mailbox: the local cell's mailbox. Its system lane drives the local cell as
            usual; its user lane (``push_user``) forwards to wherever the actor runs.
        host: builds the local stand-in actor, once per (re)start: its ``on_start``
            starts the remote actor, its ``on_stop`` stops it, and it calls
            :func:`fail` when the remote actor dies, so the supervisor decides.
    """

    mailbox: Mailbox
    host: Callable[[], Actor[Any]]


class Placement(Protocol):
    """Hosts actors outside this process; one instance per ``ActorSystem``."""

    async def place(self, actor: PlacedActor) -> Hosting:
        """Prepare to host ``actor`` (fail fast on what can never work there)."""
        ...

    async def close(self) -> None:
        """Release everything (called once, when the system shuts down)."""
        ...


PlacementFactory = Callable[["ActorSystem"], Placement]
"""Builds a system's :class:`Placement`, on the first spawn that needs it."""

_placements: dict[str, PlacementFactory] = {}


def register_placement(kind: str, factory: PlacementFactory) -> None:
    """Make ``Props`` placement ``kind`` available; a later registration replaces it."""
    _placements[kind] = factory


def placement_factory(kind: str) -> PlacementFactory:
    """The factory registered for ``kind``.

    Raises:
        LookupError: nothing registered it.
    """
    try:
        return _placements[kind]
    except KeyError:
        known = ", ".join(sorted(_placements)) or "none"
        raise LookupError(
            f"no placement {kind!r} is registered (registered: {known}); import the "
            "package that provides it, or call omni_actors.remoting.register_placement"
        ) from None


class Inbox:
    """A live actor of this process, as seen by a transport that delivers to it."""

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def path(self) -> str:
        """The actor's path."""
        return self._cell.path

    @property
    def accepts(self) -> tuple[type, ...]:
        """The actor's message types (decode against these)."""
        return self._cell.accepts

    @property
    def capacity(self) -> int:
        """Its mailbox capacity: the credit window a sender may hold."""
        return self._cell.mailbox.config.capacity

    @property
    def room(self) -> int:
        """Free user slots right now."""
        return self._cell.mailbox.room

    @property
    def closed(self) -> bool:
        """True once the actor has stopped for good."""
        return self._cell.mailbox.closed

    @property
    def ref(self) -> ActorRef[Any]:
        """The actor's ref."""
        return self._cell.ref

    def deliver(self, message: object, reply: ReplySink) -> bool:
        """Queue a message that arrived from another node; False if the actor is gone.

        A ``ControlMessage`` takes the system lane (it overtakes, and the sender spent
        no credit on it); anything else is queued regardless of room, because its
        sender held a credit — the receiver granted no more than its room.
        """
        mailbox = self._cell.mailbox
        if mailbox.closed:
            return False
        if isinstance(message, ControlMessage):
            return mailbox.push_system(sm.Control((message, reply)))
        cell = self._cell
        if not (cell.receives_now and cell.receive_now(message, reply)):
            mailbox.push_remote((message, reply))
        return True


def inbox(system: ActorSystem, path: str) -> Inbox | None:
    """The live actor of this process at ``path``, or None.

    An actor hosted elsewhere (its cell here only forwards) is not an inbox: a message
    for it must go where it runs.
    """
    cell = system._registry.get(path)
    if cell is None or cell.mailbox.closed or cell.placed:
        return None
    return Inbox(cell)


def mailbox_of(ref: ActorRef[Any]) -> Mailbox:
    """The mailbox behind ``ref`` (a placement's or a :class:`RemoteActor`'s, if remote)."""
    return ref._cell.mailbox


def in_process(ref: ActorRef[Any]) -> bool:
    """Whether ``ref``'s actor runs in this process: a message to it is handed over as
    the object itself, never encoded (device tensors in it stay where they are)."""
    cell = ref._cell
    return not isinstance(cell, RemoteActor) and not cell.placed


async def sendable(ref: ActorAddress[Any]) -> None:
    """Return once ``ref`` can travel inside a message to another process.

    A process actor whose worker is restarting has no worker to name until the new one
    is up; any other ref can be sent at once.

    Raises:
        ActorStoppedError: the actor stopped for good meanwhile.
    """
    if not isinstance(ref, ActorRef) or isinstance(ref._cell, RemoteActor):
        return  # an address, or an actor of another node: it names where it lives
    wait_linked = getattr(ref._cell.mailbox, "wait_linked", None)
    if wait_linked is not None:
        await wait_linked()


def terminated(ref: ActorRef[Any]) -> asyncio.Future[BaseException | None]:
    """Resolves with the stop reason (None: a normal stop) once ``ref`` stopped for good."""
    return ref._cell.terminated


def fail(ref: ActorRef[Any], error: BaseException | None) -> None:
    """Fail the actor behind ``ref`` now, as if its ``receive`` had raised ``error``.

    For a resource the actor depends on that died (its worker process): the failure
    reaches the actor's supervisor through its system lane. ``None`` fails it as if it
    had stopped itself (a ``permanent`` actor is then restarted).
    """
    ref._cell.mailbox.push_system(sm.Fail(error))


class RemoteActor:
    """An actor on another node, known from a ref that arrived inside a message.

    It offers what an ``ActorRef`` and ``watch`` use of a local actor, so a decoded ref
    has the usual type and API. Messages are type-checked by the receiving node, against
    the actor's own union; here it accepts anything.

    Args:
        path: the actor's path on its node.
        mailbox: forwards user messages to it (the transport's).
    """

    parent = None  # not supervised from here: ``ActorContext.stop`` refuses it
    receives_now: frozenset[type] = frozenset()  # every message goes through the wire

    def __init__(self, path: str, mailbox: Mailbox) -> None:
        self.path = path
        self.name = path.rsplit("/", 1)[-1]
        self.accepts: tuple[type, ...] = (object,)
        self.mailbox = mailbox
        self.terminated: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.watchers: set[ActorCell] = set()
        self.watching: set[ActorCell] = set()
        # The kernel's ref works over anything with a cell's public face.
        self.ref: ActorRef[Any] = ActorRef(cast("ActorCell", self))

    @property
    def closed(self) -> bool:
        """True once the actor is known to be gone."""
        return self.terminated.done()

    def close(self, reason: BaseException | None) -> None:
        """The actor (or its node) is gone: senders raise, watchers get ``Terminated``."""
        if self.terminated.done():
            return
        self.mailbox.close()
        for watcher in self.watchers:
            watcher.watching.discard(cast("ActorCell", self))
            watcher.mailbox.push_system(Terminated(self.ref, reason))
        self.watchers.clear()
        self.terminated.set_result(reason)
