"""The two ends of a message to an actor in another process.

- :class:`RemoteMailbox` stands in for the mailbox of a local cell whose actor runs in a
  worker: ``tell``/``ask`` through an ordinary ``ActorRef`` land here, wait for a credit
  (this is cross-process backpressure), then go straight onto the wire.
- :class:`RemoteReply` is what the receiving node puts in an envelope instead of a
  future: when the actor has handled the message it sends the reply (for an ask) and
  returns the credit.

A ``ControlMessage`` neither waits for nor takes a credit (it must overtake a full
mailbox), so its ``RemoteReply`` returns none.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import sys
from typing import TYPE_CHECKING, Any

from omni_actors import ActorRef
from omni_actors.errors import ActorStoppedError, MailboxFullError, OmniError
from omni_actors.protocols.message import ControlMessage
from omni_actors.remoting import Envelope, Mailbox, MailboxConfig, RemoteActor

if TYPE_CHECKING:
    from omni_actors.transport.link import Link
    from omni_actors.transport.node import Node

__all__ = [
    "RemoteError",
    "RemoteMailbox",
    "RemoteReply",
    "RemoteTarget",
    "error_from_wire",
    "error_to_wire",
]


class RemoteError(OmniError):
    """An exception from another process whose type cannot be rebuilt here."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type


def error_to_wire(error: BaseException) -> tuple[str, str]:
    """``(qualified type name, message)`` of an exception, for an ``AskFailure`` frame."""
    cls = type(error)
    return f"{cls.__module__}:{cls.__qualname__}", str(error)


def error_from_wire(error_type: str, message: str) -> BaseException:
    """Rebuild a remote exception as its own type when that is safe.

    Only classes from modules this process has already imported are used (a frame never
    makes us import code), and only ``Exception`` subclasses whose constructor takes the
    message; anything else becomes a :class:`RemoteError` carrying the name.
    """
    module_name, _, qualname = error_type.partition(":")
    module = builtins if module_name == "builtins" else sys.modules.get(module_name)
    cls: Any = module
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            if issubclass(cls, OmniError):
                raise TypeError  # structured constructors: keep the text verbatim instead
            return cls(message)
        except Exception:
            # Constructors with other signatures (most OmniErrors): same type, same text.
            error: BaseException = cls.__new__(cls)
            Exception.__init__(error, message)
            return error
    return RemoteError(error_type, message)


class RemoteReply:
    """Completes a message that arrived from another node (duck-types a reply future)."""

    __slots__ = ("_done", "capacity", "corr", "grant", "node", "peer", "target")

    def __init__(
        self,
        node: Node,
        peer: int,
        target: str,
        corr: int | None,
        *,
        grant: bool = True,
        capacity: int | None = None,
    ) -> None:
        self.node = node
        self.peer = peer
        self.target = target
        self.corr = corr
        self.grant = grant  # False for a control message: the sender spent no credit
        self.capacity = capacity  # the target's mailbox capacity, if known already
        self._done = False

    def done(self) -> bool:
        """True once answered."""
        return self._done

    def cancelled(self) -> bool:
        """A remote reply is never cancelled locally."""
        return False

    def set_result(self, value: object) -> None:
        """Send the reply (for an ask) and return the sender's credit."""
        self._done = True
        if self.corr is not None:
            self.node.reply(self.peer, self.corr, value)
        if self.grant:
            self.node.grant(self.peer, self.target, self.capacity)

    def set_exception(self, error: BaseException) -> None:
        """Send the failure (for an ask) and return the sender's credit."""
        self._done = True
        if self.corr is not None:
            self.node.reply_error(self.peer, self.corr, error)
        if self.grant:
            self.node.grant(self.peer, self.target, self.capacity)


class RemoteMailbox(Mailbox):
    """The mailbox of a cell whose actor lives in another process.

    The system lane stays local (it drives the hosting cell); user messages go to the
    remote actor. While no link is up (the worker is starting or restarting) senders wait,
    as they would for a full mailbox. Out of credits, ``fail`` raises and both
    ``backpressure`` and ``drop_oldest`` wait (messages already sent cannot be dropped);
    a ``ControlMessage`` only waits for the link.
    """

    __slots__ = (
        "_answered",
        "_bound",
        "_credit_waiters",
        "_first_limit",
        "_limit",
        "_sent",
        "credits",
        "endpoint",
        "link",
        "moved_to",
        "node",
        "peer",
        "ref",
        "reply_type",
        "target",
    )

    def __init__(self, owner: str, config: MailboxConfig, reply_type: Any) -> None:
        super().__init__(owner, config)
        self.node: Node | None = None
        self.link: Link | None = None
        self.endpoint = ""  # where the target lived last, kept after it is gone
        self.peer = -1
        self.target = ""
        self.credits = 0
        self._limit = 0  # messages this flow may send in all: credits + those sent
        self._sent = 0  # user messages sent since ``bind``
        self._answered = 0  # the last of them, by number, whose ask was answered
        self._bound = 0  # binds so far: an answer from before the last one is moot
        self._first_limit: int | None = None  # the receiver's room before it took any
        self.reply_type = reply_type
        self.ref: ActorRef[Any] | None = None  # the local ref this mailbox serves, if any
        self._credit_waiters: list[asyncio.Future[None]] = []
        # Another mailbox that now serves this one's target (see ``forward``).
        self.moved_to: RemoteMailbox | None = None

    def bind(self, node: Node, link: Link, target: str, credits: int) -> None:
        """Start forwarding to ``target`` on ``link``'s peer with ``credits`` in hand."""
        self.node, self.link = node, link
        self.peer, self.target, self.endpoint = link.peer, target, link.endpoint
        self.credits = credits
        self._limit = credits
        self._sent = self._answered = 0
        self._bound += 1
        self._first_limit = credits if credits > 0 else None
        node.register_flow(self)
        self._wake_senders()

    def unbind(self) -> None:
        """The remote actor is gone (restart or stop): hold senders until ``bind``."""
        if self.node is not None:
            self.node.unregister_flow(self)
        self.link = None
        self.credits = 0
        self._limit = 0

    async def wait_linked(self) -> None:
        """Return once the remote actor is up (a restarting worker is bound again).

        A message that carries this mailbox's ref can be sent only then: the ref names
        the worker the actor lives in.

        Raises:
            ActorStoppedError: the actor stopped for good meanwhile.
        """
        while self.link is None:
            if self.closed:
                raise ActorStoppedError(self.owner)
            await self._woken()

    async def _woken(self) -> None:
        """Wait for the next bind, credit or close."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._credit_waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            # Gone on its deadline or cancelled: else a peer that never grants would
            # keep one dead waiter per timed-out send.
            with contextlib.suppress(ValueError):
                self._credit_waiters.remove(waiter)
            raise

    def forward(self, to: RemoteMailbox) -> None:
        """Hand every send, waiting or to come, to ``to``: a mailbox for the same actor.

        Two refs to one actor of one node cannot both hold a flow (the receiver keeps
        one per sender node and target), so a held ref whose actor came back where
        this node already sends to it defers to that ref's mailbox.
        """
        self.unbind()
        self.moved_to = to
        self._wake_senders()

    @property
    def unconfirmed(self) -> int:
        """User messages sent that the receiver has not said it took: what is lost with
        it if it dies now, at most.

        It takes them in order, and says so by its grants (in batches of a quarter of
        its mailbox) and by answering an ask (every message before it was taken too).
        """
        taken = 0 if self._first_limit is None else self._limit - self._first_limit
        return max(0, self._sent - max(taken, self._answered))

    def _answer(self, bound: int, number: int, reply: asyncio.Future[Any]) -> None:
        if bound == self._bound and not reply.cancelled() and reply.exception() is None:
            self._answered = max(self._answered, number)

    def link_lost(self, error: BaseException) -> None:
        """The peer process died: unbind (asks are failed by the node)."""
        self.unbind()

    def raise_limit(self, limit: int) -> bool:
        """The receiver allows ``limit`` messages in all; False if that is no news.

        A limit at or below the one held is a replayed or reordered ``Credit``: it adds
        nothing, so the sender never holds more than the receiver's room.
        """
        if self._first_limit is None:
            self._first_limit = limit
        if limit <= self._limit:
            return False
        self.credits += limit - self._limit
        self._limit = limit
        self._wake_senders()
        return True

    @property
    def waiting_senders(self) -> int:
        """Senders waiting for a credit or the link."""
        return len(self._credit_waiters)

    def _wake_senders(self) -> None:
        waiters, self._credit_waiters = self._credit_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _blocked(self, control: bool) -> bool:
        return self.link is None or (not control and self.credits <= 0)

    def try_push_user(self, envelope: Envelope) -> bool:
        """Send now if a credit (for a control message: a link) is up; else False."""
        if self.closed:
            raise ActorStoppedError(self.owner)
        control = isinstance(envelope[0], ControlMessage)
        if self._blocked(control):
            return False
        self._send(envelope, control)
        return True

    async def push_user(self, envelope: Envelope, timeout: float | None = None) -> None:
        """Send to the remote actor once a credit (for a control message: a link) is up."""
        if self.closed:
            raise ActorStoppedError(self.owner)
        control = isinstance(envelope[0], ControlMessage)
        if self._blocked(control):
            if not control and self.config.overflow == "fail" and self.link is not None:
                raise MailboxFullError(self.owner, self.config.capacity)
            async with asyncio.timeout(timeout):
                while self._blocked(control):
                    if self.closed:
                        raise ActorStoppedError(self.owner)
                    if self.moved_to is not None:
                        await self.moved_to.push_user(envelope)  # under this deadline
                        return
                    await self._woken()
        if self.closed:
            raise ActorStoppedError(self.owner)
        self._send(envelope, control)

    def _send(self, envelope: Envelope, control: bool) -> None:
        link, node = self.link, self.node
        assert link is not None
        assert node is not None
        message, reply = envelope
        corr = None
        if reply is not None:
            assert isinstance(reply, asyncio.Future)
            corr = node.new_ask(reply, self.reply_type, self.peer)
        spent = 0 if control else 1
        self.credits -= spent
        try:
            link.send_message(self.target, message, corr)
            self._sent += spent
            if reply is not None and spent:
                number = self._sent
                reply.add_done_callback(functools.partial(self._answer, self._bound, number))
        except BaseException:
            self.credits += spent
            if reply is not None:
                reply.cancel()
            raise

    def close(self) -> list[Envelope]:
        """Refuse new messages and wake every waiting sender (they raise)."""
        self.unbind()
        pending = super().close()
        self._wake_senders()
        return pending


class RemoteTarget(RemoteActor):
    """An actor on another node, known from a ref that arrived inside a message.

    It starts unbound; once bound (``bind``, by ``RemoteRefs``) it holds no credits, so
    the first send waits until the target node grants its mailbox room. While a process
    actor restarts, refs to it are unbound again until bound to its new place (see
    ``remote_refs``): meanwhile their senders wait.
    """

    def __init__(self, node: Node, peer: int, endpoint: str, path: str) -> None:
        mailbox = RemoteMailbox(f"{path} on node {peer}", MailboxConfig(), Any)
        super().__init__(path, mailbox)
        mailbox.node, mailbox.peer, mailbox.endpoint, mailbox.target = node, peer, endpoint, path
        mailbox.ref = self.ref
        self.remote = mailbox

    def bind(self, link: Link, path: str) -> None:
        """Send to ``path`` on ``link``'s peer, with no credits until it grants some."""
        node = self.remote.node
        assert node is not None
        self.remote.owner = f"{path} on node {link.peer}"  # errors name where it is now
        self.remote.bind(node, link, path, credits=0)
