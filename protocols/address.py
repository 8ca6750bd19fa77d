"""``ActorAddress``: an actor named inside a message.

A message may tell its receiver where to send something (a stage's downstream stage, a
session's owner). Such a field is typed ``ActorAddress[M]``, ``M`` being the messages
the receiver will send there, so that protocols need nothing of the runtime. The
runtime's ``ActorRef`` is the implementation; the transport encodes an address as the
actor's node and path, and decodes it, in the receiving process, as a working ref.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

from omni_actors.protocols.message import Request

__all__ = ["DEFAULT_ASK_TIMEOUT", "ActorAddress"]

M = TypeVar("M", contravariant=True)
R = TypeVar("R")

DEFAULT_ASK_TIMEOUT = 5.0
"""Seconds an ``ask`` waits for its reply unless told otherwise."""


class ActorAddress(Generic[M]):
    """An actor that accepts messages of type ``M``: what a message can carry of it.

    Abstract: every address at run time is an ``omni_actors.ActorRef``, which documents
    the semantics of ``tell`` and ``ask``. Being contravariant in ``M``, a ref to an actor
    that accepts more (``ActorRef[Chunk | StageReport]``) is a valid ``ActorAddress[Chunk]``.
    """

    __slots__ = ()

    @property
    def path(self) -> str:
        """Unique path of the actor in its system's tree."""
        raise NotImplementedError

    async def tell(self, message: M, *, timeout: float | None = None) -> None:
        """Queue ``message`` for the actor (backpressure: waits for room)."""
        raise NotImplementedError

    def try_tell(self, message: M) -> bool:
        """Queue ``message`` if that needs no wait; False (nothing sent) if it would."""
        raise NotImplementedError

    @overload
    async def ask(self, message: Request[R], *, timeout: float = ...) -> R: ...

    @overload
    async def ask(self, message: M, *, timeout: float = ...) -> Any: ...

    async def ask(self, message: Any, *, timeout: float = DEFAULT_ASK_TIMEOUT) -> Any:
        """Send ``message`` and wait for the actor's reply: an ``R`` for a ``Request[R]``."""
        raise NotImplementedError
