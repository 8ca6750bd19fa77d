"""Bounded two-lane mailbox: a system lane always served first, and a user lane."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from omni_actors import _system_messages as sm
from omni_actors.errors import ActorStoppedError, MailboxFullError, MessageDroppedError
from omni_actors.protocols.message import ControlMessage
from omni_actors.supervision import OverflowPolicy

__all__ = ["Envelope", "Mailbox", "MailboxConfig", "ReplySink"]


class ReplySink(Protocol):
    """Where the outcome of handling a message goes: an asyncio future for a local
    ``ask``, or the transport's reply for a message that came from another process."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def set_result(self, result: Any, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


Envelope = tuple[Any, ReplySink | None]
"""A user message and, for an ``ask`` (or a remote message), where its outcome goes."""


@dataclass(frozen=True, slots=True)
class MailboxConfig:
    """Mailbox settings of an actor.

    Attributes:
        capacity: user messages the mailbox holds before the overflow policy applies.
        overflow: ``backpressure`` (``tell`` waits for room), ``drop_oldest`` (the oldest
            queued message is dropped; an asker gets ``MessageDroppedError``) or ``fail``
            (``tell`` raises ``MailboxFullError``).
        stash_capacity: messages kept aside while the actor restarts; beyond it, senders
            wait in the mailbox as usual, so nothing is lost.
    """

    capacity: int = 1000
    overflow: OverflowPolicy = "backpressure"
    stash_capacity: int = 1000

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"mailbox capacity must be >= 1, got {self.capacity}")
        if self.overflow not in ("backpressure", "drop_oldest", "fail"):
            raise ValueError(
                f"unknown overflow policy {self.overflow!r}; use backpressure, drop_oldest or fail"
            )
        if self.stash_capacity < 0:
            raise ValueError(f"stash_capacity must be >= 0, got {self.stash_capacity}")


class Mailbox:
    """The queue in front of one actor.

    Only the owning actor's task consumes it. Producers are any tasks on the same loop.
    The system lane is unbounded (system messages are few and must never be refused);
    the user lane is bounded by ``config.capacity``. User messages that are a
    ``ControlMessage`` take the system lane too, wrapped in ``sm.Control``.
    """

    __slots__ = (
        "_putters",
        "_waiter",
        "_waiter_system_only",
        "closed",
        "config",
        "owner",
        "system",
        "user",
    )

    def __init__(self, owner: str, config: MailboxConfig) -> None:
        self.owner = owner
        self.config = config
        self.system: deque[Any] = deque()
        self.user: deque[Envelope] = deque()
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._waiter_system_only = False
        self._putters: deque[asyncio.Future[None]] = deque()

    @property
    def room(self) -> int:
        """Free user slots right now."""
        return self.config.capacity - len(self.user)

    @property
    def idle(self) -> bool:
        """The owner's task waits for any message, and none has come since: both lanes
        are empty (each push wakes the waiter)."""
        waiter = self._waiter
        return waiter is not None and not self._waiter_system_only and not waiter.done()

    @property
    def waiting_senders(self) -> int:
        """Senders waiting for room (a timed-out or cancelled one leaves no trace)."""
        return len(self._putters)

    def _wake(self, system: bool) -> None:
        waiter = self._waiter
        if waiter is not None and (system or not self._waiter_system_only) and not waiter.done():
            waiter.set_result(None)

    def push_system(self, message: object) -> bool:
        """Queue a system message; returns False if the mailbox is closed."""
        if self.closed:
            return False
        self.system.append(message)
        self._wake(True)
        return True

    def push_remote(self, envelope: Envelope) -> None:
        """Queue a message that arrived from another process, regardless of capacity.

        The sender held a credit for it (the receiver granted no more than its room), so
        the capacity can only be exceeded by messages local senders added meanwhile.
        """
        self.user.append(envelope)
        self._wake(False)

    def try_push_user(self, envelope: Envelope) -> bool:
        """Queue a user message if that needs no wait; False if it would wait for room
        (then :meth:`push_user` waits, in turn). Raises as :meth:`push_user` does."""
        if self.closed:
            raise ActorStoppedError(self.owner)
        if isinstance(envelope[0], ControlMessage):
            self.push_system(sm.Control(envelope))
            return True
        user = self.user
        if len(user) < self.config.capacity and not self._putters:
            user.append(envelope)
            self._wake(False)
            return True
        return False

    async def push_user(self, envelope: Envelope, timeout: float | None = None) -> None:
        """Queue a user message, applying the overflow policy when full.

        A ``ControlMessage`` goes to the system lane instead: never refused, never waits.
        """
        # try_push_user, inlined: a call less on the path of every tell.
        if self.closed:
            raise ActorStoppedError(self.owner)
        if isinstance(envelope[0], ControlMessage):
            self.push_system(sm.Control(envelope))
            return
        user = self.user
        if len(user) < self.config.capacity and not self._putters:
            user.append(envelope)
            self._wake(False)
            return
        policy = self.config.overflow
        if policy == "fail":
            raise MailboxFullError(self.owner, self.config.capacity)
        if policy == "drop_oldest":
            self._drop_oldest()
            user.append(envelope)
            self._wake(False)
            return
        async with asyncio.timeout(timeout):
            await self._wait_for_room()
        user.append(envelope)
        self._wake(False)

    def _drop_oldest(self) -> None:
        message, reply = self.user.popleft()
        if reply is not None and not reply.done():
            reply.set_exception(MessageDroppedError(self.owner, message))

    async def _wait_for_room(self) -> None:
        loop = asyncio.get_running_loop()
        while len(self.user) >= self.config.capacity or self.closed:
            if self.closed:
                raise ActorStoppedError(self.owner)
            putter: asyncio.Future[None] = loop.create_future()
            self._putters.append(putter)
            try:
                await putter
            except BaseException:
                # A woken putter that is cancelled must pass its turn on, or a free
                # slot would go unclaimed while others wait.
                if putter.done() and not putter.cancelled():
                    self._wake_putter()
                raise
            finally:
                if not putter.done():
                    putter.cancel()
                with contextlib.suppress(ValueError):
                    self._putters.remove(putter)
        if self.closed:
            raise ActorStoppedError(self.owner)

    def _wake_putter(self) -> None:
        for putter in self._putters:
            if not putter.done():
                putter.set_result(None)
                return

    def pop_user(self) -> Envelope:
        """Take the oldest user message; wakes one sender waiting for room."""
        envelope = self.user.popleft()
        if self._putters:
            self._wake_putter()
        return envelope

    async def wait(self, system_only: bool) -> None:
        """Wait until a message arrives (only a system one if ``system_only``)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self._waiter_system_only = system_only
        try:
            await waiter
        finally:
            self._waiter = None

    def close(self) -> list[Envelope]:
        """Refuse new messages, wake every waiting sender and return what was queued.

        Control messages waiting in the system lane are returned first (they were due
        first), so that their asks fail too instead of waiting out their deadline.
        """
        self.closed = True
        for putter in self._putters:
            if not putter.done():
                putter.set_result(None)
        pending = [m.envelope for m in self.system if isinstance(m, sm.Control)]
        pending.extend(self.user)
        self.user.clear()
        self.system.clear()
        return pending
