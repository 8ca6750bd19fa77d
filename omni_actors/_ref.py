"""``ActorRef``: the only handle to an actor."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeVar, overload

from omni_actors.errors import AskTimeoutError, MessageTypeError, SendTimeoutError
from omni_actors.protocols.address import DEFAULT_ASK_TIMEOUT, ActorAddress
from omni_actors.protocols.message import Request

if TYPE_CHECKING:
    from omni_actors._cell import ActorCell

__all__ = ["ActorRef"]

M = TypeVar("M", contravariant=True)
R = TypeVar("R")


class ActorRef(ActorAddress[M]):
    """Send messages of type ``M`` to one actor.

    A ref stays valid across restarts of its actor (the mailbox, and anything stashed in
    it, survives); once the actor has stopped, ``tell`` and ``ask`` raise
    :class:`~omni_actors.errors.ActorStoppedError`. It is the runtime's
    :class:`~omni_actors.protocols.address.ActorAddress`: messages carry it as one.
    """

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def path(self) -> str:
        """Unique path in the actor tree, e.g. ``/pipeline/thinker``."""
        return self._cell.path

    @property
    def name(self) -> str:
        """Name among its siblings."""
        return self._cell.name

    @property
    def is_alive(self) -> bool:
        """False once the actor has stopped for good."""
        return not self._cell.mailbox.closed

    def _check(self, message: object) -> None:
        accepts = self._cell.accepts
        if not isinstance(message, accepts):
            raise MessageTypeError(self._cell.path, message, accepts)

    async def tell(self, message: M, *, timeout: float | None = None) -> None:
        """Queue ``message``; with the backpressure policy, wait for mailbox room.

        A :class:`~omni_actors.protocols.message.ControlMessage` never waits: it goes ahead of the
        queued messages. A type the actor lists in ``receives_now`` is handled at once,
        inside this call, if the actor is idle (see ``Actor.receive_now``).

        Args:
            message: an instance of one of the actor's declared message types.
            timeout: longest wait for room in a full mailbox; ``None`` waits as long as
                the actor lives (it raises ``ActorStoppedError`` if the actor stops).

        Raises:
            MessageTypeError: the actor does not accept this type.
            ActorStoppedError: the actor is stopped.
            MailboxFullError: the mailbox is full and its policy is ``fail``.
            SendTimeoutError: no room within ``timeout``.
        """
        self._check(message)
        cell = self._cell
        if cell.receives_now and cell.receive_now(message, None):
            return
        try:
            await cell.mailbox.push_user((message, None), timeout)
        except TimeoutError:
            assert timeout is not None
            raise SendTimeoutError(self._cell.path, timeout) from None

    def try_tell(self, message: M) -> bool:
        """Queue ``message`` if that needs no wait (or the idle actor takes it at once,
        see ``Actor.receive_now``); False if it would wait for room, and nothing was sent
        (then ``await tell(message)``). A sender that moves a stream chunk by chunk
        calls this first: most chunks go out without a coroutine of their own.

        Raises:
            MessageTypeError: the actor does not accept this type.
            ActorStoppedError: the actor is stopped.
        """
        self._check(message)
        cell = self._cell
        if cell.receives_now and cell.receive_now(message, None):
            return True
        return cell.mailbox.try_push_user((message, None))

    @overload
    async def ask(self, message: Request[R], *, timeout: float = ...) -> R: ...

    @overload
    async def ask(self, message: M, *, timeout: float = ...) -> Any: ...

    async def ask(self, message: Any, *, timeout: float = DEFAULT_ASK_TIMEOUT) -> Any:
        """Send ``message`` and wait for the value the actor's ``receive`` returns.

        The deadline covers waiting for mailbox room and for the reply, and fires even
        if the actor never answers. A :class:`~omni_actors.protocols.message.Request`
        declares its reply type (``ask(Inspect())`` is a ``StageState``); the reply to
        any other message is ``Any``.

        Raises:
            AskTimeoutError: no reply within ``timeout`` seconds.
            ActorStoppedError: the actor stopped before replying.
            Exception: whatever ``receive`` raised, re-raised as is.
        """
        self._check(message)
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        if self._cell.mailbox.try_push_user((message, reply)):
            # Sent at once: only the reply is waited for, under a timer on it (a timeout
            # scope around the wait costs several microseconds per ask).
            timer = loop.call_later(timeout, _expire, reply)
            try:
                return await reply
            except _Expired:
                raise AskTimeoutError(self._cell.path, message, timeout) from None
            finally:
                timer.cancel()
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                await self._cell.mailbox.push_user((message, reply))
                return await reply
        except TimeoutError:
            if not deadline.expired():
                raise
            reply.cancel()
            raise AskTimeoutError(self._cell.path, message, timeout) from None

    def __repr__(self) -> str:
        return f"ActorRef({self._cell.path})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorRef) and other._cell is self._cell

    def __hash__(self) -> int:
        return hash(self._cell)


class _Expired(Exception):
    """An ask's reply did not come in time (raised as ``AskTimeoutError``)."""


def _expire(reply: asyncio.Future[Any]) -> None:
    if not reply.done():
        reply.set_exception(_Expired())
