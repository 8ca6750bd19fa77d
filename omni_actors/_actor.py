"""The ``Actor`` base class: what a user subclasses."""

from __future__ import annotations

import types
import typing
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from omni_actors._mailbox import MailboxConfig
from omni_actors.supervision import SupervisorStrategy

if TYPE_CHECKING:
    from omni_actors._context import ActorContext

__all__ = ["Actor", "M", "accepted_types"]

M = TypeVar("M")


def accepted_types(declared: Any) -> tuple[type, ...] | None:
    """Flatten a declared message type (a class, a union, ``Any``) into runtime classes.

    Returns ``None`` when the declaration is still generic (a ``TypeVar``), so a subclass
    inherits its parent's set.
    """
    if isinstance(declared, TypeVar):
        return None
    if declared is Any or declared is object:
        return (object,)
    origin = typing.get_origin(declared)
    if origin is typing.Union or origin is types.UnionType:
        found: list[type] = []
        for arg in typing.get_args(declared):
            sub = accepted_types(arg)
            if sub is None:
                return None
            found.extend(t for t in sub if t not in found)
        return tuple(found)
    if origin is typing.Annotated:
        return accepted_types(typing.get_args(declared)[0])
    if origin is typing.Literal:
        return tuple(dict.fromkeys(type(v) for v in typing.get_args(declared)))
    if isinstance(origin, type):
        return (origin,)
    if isinstance(declared, type):
        return (declared,)
    if declared is None or declared is type(None):
        return (type(None),)
    raise TypeError(f"cannot check messages against {declared!r}; declare classes or unions")


def _substitute(declared: Any, mapping: dict[Any, Any]) -> Any:
    """``declared`` with its type variables replaced from ``mapping``."""
    if isinstance(declared, TypeVar):
        return mapping.get(declared, declared)
    params = getattr(declared, "__parameters__", ())
    if params:
        return declared[tuple(mapping.get(p, p) for p in params)]
    return declared


class Actor(Generic[M]):
    """An actor that processes messages of type ``M``, one at a time.

    Subclass it with the union of message types it accepts, e.g.
    ``class Counter(Actor[Increment | Get])``; ``tell`` and ``ask`` reject any other type
    with :class:`~omni_actors.errors.MessageTypeError`. Override :meth:`receive`; what it
    returns is the reply to an ``ask``, and what it raises is both re-raised to the asker
    and a failure handled by the actor's supervisor.

    Class attributes an actor may override:
        mailbox: capacity, overflow policy and stash size (``Props.mailbox`` overrides it).
        supervisor_strategy: how this actor supervises the children it spawns.
        replies: the type ``ask`` replies are decoded as when the actor runs in another
            process (``Props(process=True)``); builtins decode as ``Any``.
        receives_now: message types :meth:`receive_now` handles (exact types). A
            subclass that overrides :meth:`receive` and not :meth:`receive_now` has none.
    """

    accepts: ClassVar[tuple[type, ...]] = (object,)
    _message_type: ClassVar[Any] = Any  # the declared M, possibly with type variables
    mailbox: ClassVar[MailboxConfig] = MailboxConfig()
    supervisor_strategy: ClassVar[SupervisorStrategy] = SupervisorStrategy()
    replies: ClassVar[Any] = Any
    receives_now: ClassVar[frozenset[type]] = frozenset()

    _context: ActorContext[M]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if "receive" in own and "receive_now" not in own and "receives_now" not in own:
            # A subclass that wraps receive (to count, log, or fail on a message) must
            # see every message there: none is taken at once past it.
            cls.receives_now = frozenset()
        if "accepts" in cls.__dict__:
            return
        for base in cls.__dict__.get("__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Actor):
                args = typing.get_args(base)
                if origin is Actor:
                    declared = args[0] if args else Any
                else:
                    # A generic actor base: put our arguments in for its type variables,
                    # wherever they sit in its declaration (``Base(Actor[M | Stop])``).
                    params = getattr(origin, "__parameters__", ())
                    declared = _substitute(
                        origin._message_type, dict(zip(params, args, strict=False))
                    )
                cls._message_type = declared
                found = accepted_types(declared)
                if found is not None:
                    cls.accepts = found
                return

    @property
    def context(self) -> ActorContext[M]:
        """This actor's view of the runtime: its ref, parent, children, spawn, watch."""
        try:
            return self._context
        except AttributeError:
            raise RuntimeError(
                f"{type(self).__qualname__}.context is only available once the actor is "
                "spawned (use on_start, not __init__)"
            ) from None

    async def receive(self, message: M) -> Any:
        """Handle one message; the return value answers an ``ask``."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement receive()")

    def receive_now(self, message: M) -> Callable[[], Awaitable[None]] | None:
        """Handle ``message`` (one of :attr:`receives_now`) at once, without awaiting.

        A stream's hot message (a stage's chunk) reaching an *idle* actor — its task
        parked on an empty mailbox, nothing stashed — is handed to this method in the
        sender's task instead of being queued: one task wake-up less per message, the
        biggest per-chunk cost on a loop that moves thousands of them a second. The
        message would have been the next one handled anyway, so the order of messages
        is as through the mailbox; a message that arrives while the actor is busy, or
        sent with ``ask``, takes the mailbox and :meth:`receive` as usual.

        It must not await (it runs to its end inside the sender's ``tell``). What it
        raises fails the actor as if :meth:`receive` had raised it. To finish with work
        that awaits, return a callable making that awaitable: the actor's own task
        awaits it before any later message, as the rest of this message's handling.

        Returns:
            None if the message is handled, else the rest of its handling.
        """
        raise NotImplementedError(f"{type(self).__qualname__} must implement receive_now()")

    async def on_start(self) -> None:
        """Called before the first message, after every restart too (spawn children here)."""

    async def on_stop(self) -> None:
        """Called once when this instance is discarded: stop, or before a restart."""

    async def on_restart(self, cause: BaseException | None) -> None:
        """Called on the fresh instance after a restart, before ``on_start``.

        ``cause`` is the failure that triggered the restart: the actor's own exception,
        a sibling's (``one_for_all``/``rest_for_one``), or ``None`` when a permanent
        actor had stopped itself.
        """
