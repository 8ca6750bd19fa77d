"""``Node``: one process's ZeroMQ presence — an inbox for its actors, links to peers.

Every process that hosts actors runs one node. A node binds a PULL socket (its inbox)
and opens one PUSH socket per peer it sends to, so frames flow straight from the
producing process to the consuming one with no broker in between.

Sends are synchronous and never block: outgoing sockets have no high-water mark, and
what bounds their queues is credit-based flow control — a sender only sends a user
message while it holds a credit granted by the receiving actor's mailbox, and every
other frame (reply, credit, control) answers one of those.

What reaches the inbox is hostile until shown otherwise: with a deployment token only
processes holding it connect (``peer_auth``); malformed frames, user messages from no
peer or replayed (``inbox_guard``), stale credits and second slab offers are refused —
counted in ``refusals``, logged, never handed to an actor.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from omni_actors import remoting
from omni_actors.errors import ActorRestartingError, ActorStoppedError, ProtocolError
from omni_actors.protocols import wire
from omni_actors.protocols.message import ControlMessage
from omni_actors.transport import peer_auth
from omni_actors.transport.codec import Decoder, slab_slots
from omni_actors.transport.credit_ledger import CreditLedger
from omni_actors.transport.endpoints import CurveKeys
from omni_actors.transport.inbox_guard import InboxGuard
from omni_actors.transport.link import Link
from omni_actors.transport.remote import RemoteMailbox, RemoteReply, error_from_wire, error_to_wire
from omni_actors.transport.remote_refs import RemoteRefs
from omni_actors.transport.shm import SlabReader, SlabWriter

if TYPE_CHECKING:
    from omni_actors import ActorRef, ActorSystem

__all__ = ["Node"]

log = logging.getLogger(__name__)

ControlHandler = Callable[[wire.WireMessage], None]
_NOBLOCK = int(zmq.NOBLOCK)  # not the enum: an int per call is cheaper


class Node:
    """The ZeroMQ endpoint of one process.

    Args:
        system: the actor system whose actors receive what arrives.
        node_id: unique per process within a deployment (0 is the parent).
        endpoint: where to bind the inbox (``ipc://...`` or ``tcp://host:port``).
        curve: CURVE keys; required for TCP across hosts.
        shm_threshold: tensors at least this big go through a shared-memory slab on
            same-host links.
        token: the deployment token (see ``peer_auth``): an IPC inbox then admits only
            connections presenting it, and links present it. None trusts every process
            that can reach the inbox (this user's, for an IPC one).
    """

    def __init__(
        self,
        system: ActorSystem,
        node_id: int,
        endpoint: str,
        *,
        curve: CurveKeys | None = None,
        shm_threshold: int = 1 << 20,
        token: bytes | None = None,
    ) -> None:
        self.system = system
        self.node_id = node_id
        self.endpoint = endpoint
        self.curve = curve
        self.shm_threshold = shm_threshold
        self.control: ControlHandler | None = None
        self.token = token
        self.guard = InboxGuard(node_id)
        self.refusals = self.guard.refusals
        self.slabs = SlabReader()
        self._ctx = zmq.Context()
        self._inbox = self._ctx.socket(zmq.PULL)
        self._wire_decoder = msgspec.msgpack.Decoder(wire.WireMessage)
        self._links: dict[int, Link] = {}
        self._asks: dict[int, tuple[asyncio.Future[Any], Decoder[Any], int]] = {}
        self._corr = itertools.count(1)
        self._flows: dict[tuple[int, str], RemoteMailbox] = {}
        self._decoders: dict[Any, Decoder[Any]] = {}
        self._by_accepts: dict[tuple[type, ...], Decoder[Any]] = {}
        self.refs = RemoteRefs(self)
        # Messages sent to peers that died before saying they took them (an upper bound
        # of those lost, see ``count_lost``): counted and logged, never without a word.
        self.lost = 0
        self._credits = CreditLedger()
        self._reading = False
        self._auth: peer_auth.PeerAuthenticator | None = None
        # Over TCP: the CURVE public key of each node this one may link to and admit.
        self.peer_keys = peer_auth.KeyRing(curve.peers if curve is not None else ())

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the inbox and start receiving."""
        self._auth = peer_auth.guard_inbox(
            self._ctx, self._inbox, self.refusals, self.curve, self.token, self.peer_keys
        )
        self._inbox.bind(self.endpoint)
        self.endpoint = self._inbox.getsockopt_string(zmq.LAST_ENDPOINT)
        loop = asyncio.get_running_loop()
        loop.add_reader(self._inbox.FD, self._on_readable)
        self._reading = True
        loop.call_soon(self._on_readable)  # frames may have arrived before the reader

    async def close(self) -> None:
        """Stop receiving, close every socket and fail asks still waiting for replies."""
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._inbox.FD)
            self._reading = False
        for link in self._links.values():
            link.close()
        self._links.clear()
        closed = ActorStoppedError(f"node {self.node_id}", "closed")
        self._fail_asks(lambda _: True, closed)
        self.refs.close(closed)
        self._inbox.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self.slabs.close()
        self._ctx.term()

    def connect(self, peer: int, endpoint: str, *, server_public: bytes | None = None) -> Link:
        """Open (or return) the link to ``peer`` listening at ``endpoint`` (over TCP:
        with ``server_public`` or, if not given, the key in ``peer_keys``)."""
        link = self._links.get(peer)
        if link is not None:
            return link
        socket = self._ctx.socket(zmq.PUSH)
        socket.setsockopt(zmq.SNDHWM, 0)  # bounded by credits instead: see module doc
        socket.setsockopt(zmq.LINGER, 0)
        if endpoint.startswith("tcp://"):
            server_public = server_public or self.peer_keys.get(peer)
            if self.curve is None or server_public is None:
                socket.close()
                raise ValueError("TCP links need CurveKeys and the server's public key")
            self.curve.apply_client(socket, server_public)
        elif self.token is not None:
            peer_auth.apply_client(socket, self.node_id, self.token)
        socket.connect(endpoint)
        link = Link(self, peer, endpoint, socket)
        self._links[peer] = link
        if endpoint.startswith("ipc://"):
            link.use_slab(SlabWriter.create(slab_id=self.node_id))
        return link

    def count_lost(self, peer: int, n: int) -> None:
        """``n`` messages sent to ``peer``, which went down, were never confirmed taken.

        An upper bound of what was lost: a receiver confirms in batches (its credit
        grants, a quarter of its mailbox at a time) and by answering asks.
        """
        if n > 0:
            self.lost += n
            what = "node %d went down before confirming %d message(s) from node %d: at most"
            log.warning(what + " that many were lost (%d in all)", peer, n, self.node_id, self.lost)

    def disconnect(self, peer: int, error: BaseException, *, count: bool = True) -> None:
        """Forget ``peer`` (it died or left): close its link and fail flows to it.

        ``count``: what it had not confirmed taking was lost (it died), not dropped by
        a planned stop.
        """
        flows = [k for k in self._flows if k[0] == peer]
        if count:  # a ref's target is one of these flows: counted here, and only here
            self.count_lost(peer, sum(self._flows[k].unconfirmed for k in flows))
        link = self._links.pop(peer, None)
        if link is not None:
            link.close()
        self.peer_keys.forget(peer)  # a node that left may not connect again
        self.guard.forget_peer(peer)
        self._credits.forget_peer(peer)
        # Its slab goes too (its fd and mapping; a successor offers its own), once the
        # views still alive over it are collected.
        self.slabs.forget(peer)
        self._fail_asks(lambda p: p == peer, error)
        for key in flows:
            self._flows.pop(key).link_lost(error)
        self.refs.forget_node(peer, error)

    def broadcast(self, message: wire.WireMessage, *, exclude: int) -> None:
        """Send ``message`` to every linked peer but ``exclude``."""
        for peer, link in list(self._links.items()):
            if peer != exclude:
                link.send(message)

    # -- refs inside messages ---------------------------------------------------------

    def encode_ref(self, ref: ActorRef[Any]) -> wire.RefDesc:
        """Where ``ref``'s actor lives, for a peer: its node, endpoint and path there.

        Raises:
            ActorRestartingError: its worker is restarting (the message is not sent).
        """
        mailbox = remoting.mailbox_of(ref)
        if isinstance(mailbox, RemoteMailbox):
            while mailbox.moved_to is not None:
                mailbox = mailbox.moved_to
            unbound = mailbox.link is None and not (mailbox.closed and mailbox.endpoint)
            # A held ref names where its actor was: the receiver follows it as we do.
            if unbound and not self.refs.holds(mailbox):
                raise ActorRestartingError(ref.path, "it is restarting; its ref cannot be sent now")
            # A dead actor's ref still names where it lived; the receiver finds it dead.
            return wire.RefDesc(mailbox.peer, mailbox.endpoint, mailbox.target)
        return wire.RefDesc(self.node_id, self.endpoint, ref.path)

    def decode_ref(self, desc: wire.RefDesc) -> ActorRef[Any]:
        """A usable ref from a descriptor: local, already known, or a new remote target."""
        if desc.node == self.node_id:
            inbox = remoting.inbox(self.system, desc.path)
            if inbox is None:
                raise ProtocolError(f"a ref to {desc.path}, which is not running here")
            return inbox.ref
        known = self._flows.get((desc.node, desc.path))
        if known is not None and known.ref is not None and not known.closed:
            return known.ref
        return self.refs.decode(desc)

    def _open_flow(self, request: wire.OpenFlow) -> None:
        # Over CURVE the handshake has checked the peer's key: a host of the deployment.
        known = request.sender in self._links or self.curve is not None
        if not self.guard.admit_flow(request, known, self.endpoint):
            return
        link = self.connect(request.sender, request.endpoint)
        inbox = remoting.inbox(self.system, request.target)
        if inbox is None:
            self._credits.close(request.sender, request.target)
            link.send(wire.FlowClosed(self.node_id, request.target))
        else:
            limit = self._credits.open(request.sender, request.target, inbox.room)
            link.send(wire.Credit(self.node_id, request.target, limit))

    # -- sending --------------------------------------------------------------------

    def link(self, peer: int) -> Link:
        """The open link to ``peer``."""
        try:
            return self._links[peer]
        except KeyError:
            raise ActorStoppedError(f"node {peer}", "no link to it") from None

    def register_flow(self, mailbox: RemoteMailbox) -> None:
        """Route ``Credit`` frames for ``mailbox``'s target to it."""
        self._flows[(mailbox.peer, mailbox.target)] = mailbox

    def unregister_flow(self, mailbox: RemoteMailbox) -> None:
        """Stop routing credits to ``mailbox``."""
        if self._flows.get((mailbox.peer, mailbox.target)) is mailbox:
            del self._flows[(mailbox.peer, mailbox.target)]

    def new_ask(self, reply: asyncio.Future[Any], reply_type: Any, peer: int) -> int:
        """Register ``reply`` to be resolved by an ``AskReply``/``AskFailure``; returns its id."""
        corr = next(self._corr)
        self._asks[corr] = (reply, self._decoder(reply_type), peer)
        reply.add_done_callback(lambda _: self._asks.pop(corr, None))
        return corr

    def _fail_asks(self, match: Callable[[int], bool], error: BaseException) -> None:
        """Fail the pending asks whose peer satisfies ``match``."""
        for corr in [c for c, entry in self._asks.items() if match(entry[2])]:
            reply = self._asks.pop(corr)[0]
            if not reply.done():
                reply.set_exception(error)

    def grant(self, peer: int, target: str, capacity: int | None = None) -> None:
        """``target`` (its mailbox ``capacity``, if known: else looked up) handled a
        message from ``peer``: return its credit (batched, see ``credit_ledger``)."""
        if capacity is None:
            inbox = remoting.inbox(self.system, target)
            capacity = inbox.capacity if inbox is not None else 1
        limit = self._credits.handled(peer, target, capacity)
        if limit is None:
            return
        link = self._links.get(peer)
        if link is not None:
            link.send(wire.Credit(self.node_id, target, limit))

    def reply(self, peer: int, corr: int, value: object) -> None:
        """Send the answer to ``Ask`` number ``corr`` back to ``peer``."""
        link = self._links.get(peer)
        if link is None:
            return
        buffers: list[Any] = []
        try:
            body = msgspec.Raw(link.encoder.encode_into(value, buffers))
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            link.send(wire.AskFailure(corr, *error_to_wire(exc)))
            return
        link.send(wire.AskReply(corr, body), buffers)

    def reply_error(self, peer: int, corr: int, error: BaseException) -> None:
        """Send the exception raised for ``Ask`` number ``corr`` back to ``peer``."""
        link = self._links.get(peer)
        if link is not None:
            link.send(wire.AskFailure(corr, *error_to_wire(error)))

    # -- receiving ------------------------------------------------------------------

    def _on_readable(self) -> None:
        """Drain the inbox; called by the loop when its (edge-triggered) FD fires.

        Reading synchronously in the FD callback costs no task switch per frame. It
        drains until ``recv`` raises ``Again`` (else a frame could wait for the next
        edge), never asking ``EVENTS`` per frame: a syscall each (~6 us here).
        """
        recv = self._inbox.recv
        decode = self._wire_decoder.decode
        while True:
            try:
                # Parts arrive together: ``Frame.more``, not a socket option per part.
                frame = recv(_NOBLOCK, copy=False)
                frames = [frame]
                while frame.more:
                    frame = recv(_NOBLOCK, copy=False)
                    frames.append(frame)
            except zmq.ZMQError:
                return  # drained (``Again``), or closed under us during shutdown
            try:
                envelope = decode(frames[0].buffer)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
                self.refusals.refuse("malformed frame", exc)
                continue
            messages: list[wire.Single]
            if isinstance(envelope, wire.Batch):
                messages, buffers = envelope.messages, []  # a batch carries no buffers
            else:
                messages, buffers = [envelope], [frame.buffer for frame in frames[1:]]
            for message in messages:
                try:
                    self._dispatch(message, buffers)
                except Exception:
                    # One bad frame must never stop the inbox.
                    log.exception("node %d failed to handle %s", self.node_id, type(message))

    def _dispatch(self, envelope: wire.Single, buffers: list[memoryview]) -> None:
        match envelope:
            case wire.Tell() | wire.Ask():
                self._deliver(envelope, buffers)
            case wire.Credit(node=peer, target=target, limit=limit):
                flow = self._flows.get((peer, target))
                if flow is not None and not flow.raise_limit(limit):
                    self.refusals.refuse("stale credit grant", envelope)
            case wire.OpenFlow():
                self._open_flow(envelope)
            case wire.FlowClosed(node=peer, target=target):
                self.refs.flow_closed(peer, target)
            case wire.NodeDown(node=peer, reason=reason, stopped=stopped):
                error = ActorStoppedError(f"node {peer}", reason)
                self.refs.node_down(envelope, error)  # first: it holds a restarting actor's
                self.disconnect(peer, error, count=not stopped)
            case wire.ActorMoved():
                self.refs.moved(envelope)
            case wire.ActorGone():
                self.refs.gone(envelope)
            case wire.PeerKeys(keys=keys) if self.curve is not None and self.node_id != 0:
                for peer, key in keys.items():  # from the parent: it hands keys out
                    self.peer_keys.add(peer, key.encode())
                if self.control is not None:
                    self.control(envelope)  # a new worker waits for its keys
            case wire.AskReply(corr=corr, body=body):
                entry = self._asks.get(corr)
                if entry is not None and not entry[0].done():
                    reply, reply_decoder, _ = entry
                    try:
                        reply.set_result(reply_decoder.decode(body, buffers))
                    except ProtocolError as exc:
                        reply.set_exception(exc)
            case wire.AskFailure(corr=corr, error_type=error_type, message=message):
                entry = self._asks.get(corr)
                if entry is not None and not entry[0].done():
                    entry[0].set_exception(error_from_wire(error_type, message))
            case wire.SlabOffer(node=peer, slab_id=slab_id, name=name):
                if self.slabs.attached(peer):
                    # A link offers its slab once; another would remap slots in use.
                    self.refusals.refuse("second slab offer", envelope)
                    return
                self.slabs.attach(name, slab_id=peer)
                link = self._links.get(peer)
                if link is not None:
                    link.send(wire.SlabAttached(self.node_id, slab_id))
            case wire.SlabAttached(node=peer):
                link = self._links.get(peer)
                if link is not None and link.slab is not None:
                    link.slab.unlink()  # both sides have it mapped: nothing can leak now
            case _:
                if self.control is None:
                    log.warning("node %d has no handler for %r", self.node_id, envelope)
                else:
                    self.control(envelope)

    def _deliver(self, envelope: wire.Tell | wire.Ask, buffers: list[memoryview]) -> None:
        if not self.guard.admit_message(envelope, envelope.sender in self._links):
            # Its slots are not released: they are the replayed message's, or a
            # stranger's guess at one in flight, which it must not free.
            return
        corr = envelope.corr if isinstance(envelope, wire.Ask) else None
        inbox = remoting.inbox(self.system, envelope.target)
        if inbox is None:
            self._release_slots(envelope.body)
            if corr is not None:
                self.reply_error(envelope.sender, corr, ActorStoppedError(envelope.target))
            return
        decoder = self._decoder_for(inbox.accepts)
        try:
            message = decoder.decode(envelope.body, buffers)
        except ProtocolError as exc:
            log.warning("node %d: bad message for %s: %s", self.node_id, inbox.path, exc)
            self._release_slots(envelope.body)
            if corr is not None:
                self.reply_error(envelope.sender, corr, exc)
            self.grant(envelope.sender, envelope.target)
            return
        if decoder.type is Any:
            self._release_slots(envelope.body)  # untyped: no tensor was built over a slot
        # A control message was sent without a credit (to overtake): none goes back.
        grant = not isinstance(message, ControlMessage)
        reply = RemoteReply(
            self, envelope.sender, envelope.target, corr, grant=grant, capacity=inbox.capacity
        )
        if not inbox.deliver(message, reply):
            reply.set_exception(ActorStoppedError(inbox.path))

    def _release_slots(self, body: msgspec.Raw) -> None:
        """Give back the slab slots of a message dropped undecoded (else they leak)."""
        for slab, slot in slab_slots(body):
            self.slabs.release(slab, slot)

    def _decoder_for(self, accepts: tuple[type, ...]) -> Decoder[Any]:
        decoder = self._by_accepts.get(accepts)  # a Union made per message cost ~4 us
        if decoder is None:
            union = Any if accepts == (object,) else typing.Union[accepts]  # noqa: UP007
            decoder = self._by_accepts[accepts] = self._decoder(union)
        return decoder

    def _decoder(self, type_: Any) -> Decoder[Any]:
        decoder = self._decoders.get(type_)
        if decoder is None:
            decoder = Decoder(type_, slab_reader=self.slabs, ref_hook=self.decode_ref)
            self._decoders[type_] = decoder
        return decoder
