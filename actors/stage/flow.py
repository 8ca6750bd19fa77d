"""Credit windows: flow control per (session, edge) stream.

Every stream of a session — the caller's input into the entry stage, a stage's output to
each downstream stage, the output stages' chunks to the session's owner (the caller's
events) — has its own window of ``size`` chunks in flight. The sender spends a credit per
chunk (:class:`CreditWindow`) and waits when it has none; the receiver (:class:`Inflow`)
counts the chunks its consumer takes — the engine pulling its input, or the caller
reading its events — and grants them back with a
:class:`~omni_actors.protocols.control.StreamCredit` once half a window has been taken,
so a grant costs one small message per ``size / 2`` chunks. A stage grants through the
session's owner, which passes each credit on to its sender. The mailbox's own credit
(what a whole actor can hold) stays underneath; this one is per session, so a slow
consumer holds up only its own session's producers, never a stage's mailbox or the other
sessions on it.

The bounds that follow: a receiver holds at most ``size`` chunks of each stream of a
session (in its mailbox and the session's queue together), so a session's memory on a
stage is bounded by ``size`` x the chunk size of each edge into it, and the caller's
event queue by ``size`` chunks per output stage. A sender that goes past its window is
a protocol error on the receiver (:class:`WindowExceededError`), never queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from omni_actors.clock import Clock
from omni_actors.errors import ActorStoppedError, OmniError, ProtocolError, SendTimeoutError
from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.control import StreamCredit
from omni_actors.protocols.stage import SessionKey

__all__ = ["BackpressureError", "CreditWindow", "Inflow", "WindowExceededError", "send_credit"]

log = logging.getLogger(__name__)


class BackpressureError(OmniError, TimeoutError):
    """A sender waited for a credit longer than ``deadlines.inter_chunk_s``: its receiver
    has taken none of the chunks in flight (a caller that stopped reading its events, a
    stage that stopped taking input)."""

    code = "backpressure"

    def __init__(self, sender: str, receiver: str, key: str, size: int, limit: float) -> None:
        if receiver == "client":
            hint = (
                "the caller is not reading the session's events: read them as they come, "
                "or raise deadlines.inter_chunk_s (or flow.window) in the pipeline (in a "
                "conversation, what an engine yields before the caller asks for the reply "
                "waits for respond())"
            )
        else:
            hint = (
                f"{receiver} is not taking its input; raise deadlines.inter_chunk_s "
                "(or flow.window) in the pipeline if that wait is expected"
            )
        super().__init__(
            f"{sender} -> {receiver}, session {key}: no credit within {limit:g}s "
            f"(all {size} chunks of its window in flight); {hint}"
        )
        self.sender = sender
        self.receiver = receiver
        self.limit = limit


class WindowExceededError(ProtocolError):
    """A sender sent more chunks than its credit window allows (a bug in the sender)."""

    def __init__(self, receiver: str, source: str, key: str, size: int) -> None:
        super().__init__(
            f"{source} -> {receiver}, session {key}: more than {size} chunks in flight; "
            "a sender must wait for a StreamCredit once its window is used up"
        )


class CreditWindow:
    """The sending end of one stream: the credits in hand.

    A sender calls :meth:`try_take` before each chunk (no await on the common path) and
    :meth:`take` only when it returns False.
    """

    __slots__ = ("_waiter", "closed", "credits", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a credit window holds at least 1 chunk, got {size}")
        self.size = size
        self.credits = size
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None

    def try_take(self) -> bool:
        """Spend one credit if one is left; none is once the window is closed (the
        stream ended: what would be sent is moot, as :meth:`take` says)."""
        if self.credits > 0 and not self.closed:
            self.credits -= 1
            return True
        return False

    async def take(self, clock: Clock, limit: float) -> bool:
        """Spend one credit, waiting for a grant if none is left.

        Returns:
            False if the window was closed (the stream ended) before a credit came.

        Raises:
            TimeoutError: no credit came within ``limit`` seconds of ``clock`` time; the
                sender turns it into its :class:`BackpressureError`.
        """
        if self.credits <= 0 and not self.closed:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            # A timer on the waiter, as a stage waits for input: no task, no context.
            timer = clock.call_at(clock.now() + limit, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        if self.closed:
            return False
        self.credits -= 1
        return True

    def grant(self, n: int) -> None:
        """The receiver has taken ``n`` more chunks: that many may be sent."""
        self.credits += n
        self._wake()

    def close(self) -> None:
        """The stream has ended: a waiting sender returns at once (False)."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (self.credits > 0 or self.closed):
            waiter.set_result(None)


class _Ledger:
    """One source's count on the receiving end: chunks received, taken, granted back."""

    __slots__ = ("granted", "received", "taken", "to")

    def __init__(self, to: ActorAddress[StreamCredit] | None) -> None:
        self.to = to
        self.received = 0
        self.taken = 0
        self.granted = 0  # credits sent back, beyond the window the sender started with


class Inflow:
    """The receiving end of one session's streams into ``receiver``.

    Args:
        key: the session's key on the stages.
        receiver: the receiving end's name in credits and errors (a stage, or
            ``client`` for the caller's events).
        size: the window of every stream.
        upstream: per source, where its credits go (the sender, or the session's owner
            that passes them on).
    """

    __slots__ = ("_batch", "_ledgers", "key", "receiver", "size")

    def __init__(
        self,
        key: SessionKey,
        receiver: str,
        size: int,
        upstream: Mapping[str, ActorAddress[StreamCredit] | None],
    ) -> None:
        self.key = key
        self.receiver = receiver
        self.size = size
        # Half a window: the sender never runs dry while the receiver keeps taking, and
        # a grant costs one message per size / 2 chunks.
        self._batch = max(1, size // 2)
        self._ledgers = {source: _Ledger(to) for source, to in upstream.items()}

    def received(self, source: str) -> None:
        """Count a fresh chunk from ``source`` (not a duplicate).

        Raises:
            WindowExceededError: the sender has more than its window in flight.
        """
        ledger = self._ledgers.get(source)
        if ledger is None:
            return  # not a stream of this session: the caller reports that itself
        ledger.received += 1
        if ledger.received - ledger.granted > self.size:
            raise WindowExceededError(self.receiver, source, self.key, self.size)

    def taken(self, source: str) -> int:
        """Count a chunk from ``source`` taken by the consumer; the credits now due
        (send them with :meth:`grant`), or 0 until half a window is due."""
        ledger = self._ledgers.get(source)
        if ledger is None:
            return 0
        ledger.taken += 1
        due = ledger.taken - ledger.granted
        if due < self._batch:
            return 0
        ledger.granted += due
        return due

    def untake(self, source: str, due: int) -> None:
        """Undo :meth:`taken` whose grant of ``due`` could not be sent (the reader was
        cancelled first): the chunk counts as not taken, and the credits stay owed."""
        ledger = self._ledgers[source]
        ledger.taken -= 1
        ledger.granted -= due

    async def grant(self, source: str, n: int) -> None:
        """Send ``source`` a credit for ``n`` chunks."""
        to = self._ledgers[source].to
        if to is None:
            log.debug("session %s: no address to grant %s credits to", self.key, source)
            return
        await send_credit(
            to, StreamCredit(key=self.key, source=source, receiver=self.receiver, n=n)
        )


async def send_credit(to: ActorAddress[StreamCredit], credit: StreamCredit) -> None:
    """Send ``credit`` without waiting: a credit a sender cannot take at once is moot.

    A control message waits only for its receiver's link, and an actor without one is
    restarting (it lost its sessions with their credits) or gone.
    """
    with contextlib.suppress(ActorStoppedError, SendTimeoutError):
        await to.tell(credit, timeout=0.0)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
