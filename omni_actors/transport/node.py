"""``Node``: one process's ZeroMQ presence — an inbox for its actors, links to peers.

Every process that hosts actors runs one node. A node binds a PULL socket (its inbox)
and opens one PUSH socket per peer it sends to, so frames flow straight from the
producing process to the consuming one with no broker in between.

Sends are synchronous and never block: outgoing sockets have no high-water mark, and
what bounds their queues is credit-based flow control — a sender only sends a user
message while it holds a credit granted by the receiving actor's mailbox, and every
other frame (reply, credit, control) answers one of those.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import typing
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from omni_actors.errors import ActorStoppedError, ProtocolError
from omni_actors.protocols import wire
from omni_actors.transport.codec import Decoder, Encoder
from omni_actors.transport.endpoints import CurveKeys
from omni_actors.transport.remote import RemoteReply, error_from_wire, error_to_wire
from omni_actors.transport.shm import SlabReader, SlabWriter

if TYPE_CHECKING:
    from omni_actors._cell import ActorCell
    from omni_actors._system import ActorSystem
    from omni_actors.transport.remote import RemoteMailbox

__all__ = ["Link", "Node"]

log = logging.getLogger(__name__)

ControlHandler = Callable[[wire.WireMessage], None]
ZERO_COPY_MIN_BYTES = 64 * 1024
_POLLIN = int(zmq.POLLIN)
# TensorDesc on the wire: ["T", lib, dtype, shape, data, buffer, slab, slot, offset, nbytes]
_DESC_TAG = "T"
_DESC_FIELDS = 10
_DESC_SLAB = 6
_wire_encoder = msgspec.msgpack.Encoder()


class Link:
    """The sending half of a connection from this node to one peer."""

    def __init__(self, node: Node, peer: int, endpoint: str, socket: zmq.Socket[bytes]) -> None:
        self.node = node
        self.peer = peer
        self.endpoint = endpoint
        self.socket = socket
        self.slab: SlabWriter | None = None
        self.encoder = Encoder(slab_threshold=node.shm_threshold)

    def use_slab(self, slab: SlabWriter) -> None:
        """Route large tensors through ``slab`` (offered to the peer right away)."""
        self.slab = slab
        self.encoder = Encoder(slab_writer=slab, slab_threshold=self.node.shm_threshold)
        self.send(wire.SlabOffer(self.node.node_id, slab.slab_id, slab.name))

    def send(self, envelope: wire.WireMessage, buffers: Sequence[Any] = ()) -> None:
        """Send one frame without blocking (see the module docstring for the bound)."""
        header = _wire_encoder.encode(envelope)
        socket = self.socket
        if not buffers:
            socket.send(header)
            return
        # Zero-copy frames cost a free-callback round trip through pyzmq's garbage
        # thread: worth it for big buffers only, so small ones are simply copied.
        socket.send(header, zmq.SNDMORE)
        last = len(buffers) - 1
        for i, buffer in enumerate(buffers):
            socket.send(
                buffer,
                zmq.SNDMORE if i < last else 0,
                copy=memoryview(buffer).nbytes < ZERO_COPY_MIN_BYTES,
            )

    def send_message(self, target: str, message: object, corr: int | None = None) -> None:
        """Encode a user message for ``target`` on the peer and send it."""
        buffers: list[Any] = []
        body = msgspec.Raw(self.encoder.encode_into(message, buffers))
        sender = self.node.node_id
        envelope: wire.WireMessage = (
            wire.Tell(target, sender, body)
            if corr is None
            else wire.Ask(target, sender, corr, body)
        )
        self.send(envelope, buffers)

    def close(self) -> None:
        """Close the socket (pending frames are dropped) and release the slab."""
        self.socket.close(linger=0)
        if self.slab is not None:
            self.slab.close()
            self.slab = None


class Node:
    """The ZeroMQ endpoint of one process.

    Args:
        system: the actor system whose actors receive what arrives.
        node_id: unique per process within a deployment (0 is the parent).
        endpoint: where to bind the inbox (``ipc://...`` or ``tcp://host:port``).
        curve: CURVE keys; required for TCP across hosts.
        shm_threshold: tensors at least this big go through a shared-memory slab on
            same-host links.
    """

    def __init__(
        self,
        system: ActorSystem,
        node_id: int,
        endpoint: str,
        *,
        curve: CurveKeys | None = None,
        shm_threshold: int = 1 << 20,
    ) -> None:
        self.system = system
        self.node_id = node_id
        self.endpoint = endpoint
        self.curve = curve
        self.shm_threshold = shm_threshold
        self.control: ControlHandler | None = None
        self.slabs = SlabReader()
        self._ctx = zmq.Context()
        self._inbox = self._ctx.socket(zmq.PULL)
        self._wire_decoder = msgspec.msgpack.Decoder(wire.WireMessage)
        self._links: dict[int, Link] = {}
        self._asks: dict[int, tuple[asyncio.Future[Any], Decoder[Any], int]] = {}
        self._corr = itertools.count(1)
        self._flows: dict[tuple[int, str], RemoteMailbox] = {}
        self._decoders: dict[Any, Decoder[Any]] = {}
        self._grants: defaultdict[tuple[int, str], int] = defaultdict(int)
        self._reading = False
        self._auth: Any = None

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the inbox and start receiving."""
        if self.curve is not None:
            self.curve.apply_server(self._inbox)
            self._auth = self.curve.start_authenticator(self._ctx)
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
        self._fail_asks(lambda _: True, ActorStoppedError(f"node {self.node_id}", "closed"))
        self._inbox.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self.slabs.close()
        self._ctx.term()

    def connect(self, peer: int, endpoint: str, *, server_public: bytes | None = None) -> Link:
        """Open (or return) the link to ``peer`` listening at ``endpoint``."""
        link = self._links.get(peer)
        if link is not None:
            return link
        socket = self._ctx.socket(zmq.PUSH)
        socket.setsockopt(zmq.SNDHWM, 0)  # bounded by credits instead: see module doc
        socket.setsockopt(zmq.LINGER, 0)
        if endpoint.startswith("tcp://"):
            if self.curve is None or server_public is None:
                raise ValueError("TCP links need CurveKeys and the server's public key")
            self.curve.apply_client(socket, server_public)
        socket.connect(endpoint)
        link = Link(self, peer, endpoint, socket)
        self._links[peer] = link
        if endpoint.startswith("ipc://"):
            link.use_slab(SlabWriter.create(slab_id=self.node_id))
        return link

    def disconnect(self, peer: int, error: BaseException) -> None:
        """Forget ``peer`` (it died or left): close its link and fail flows to it."""
        link = self._links.pop(peer, None)
        if link is not None:
            link.close()
        self._fail_asks(lambda p: p == peer, error)
        for key in [k for k in self._flows if k[0] == peer]:
            self._flows.pop(key).link_lost(error)

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
        """Register ``reply`` to be resolved by a ``Reply``/``Failure``; returns its id."""
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

    def grant(self, peer: int, target: str) -> None:
        """Return one credit to ``peer`` for ``target``, in batches of a quarter window.

        Holding back fewer than a quarter of the window never starves the sender (it
        still holds the other three quarters) and saves a frame per message.
        """
        key = (peer, target)
        count = self._grants[key] + 1
        cell = self.system._registry.get(target)
        window = cell.mailbox.config.capacity if cell is not None else 1
        if count < max(1, window // 4):
            self._grants[key] = count
            return
        self._grants[key] = 0
        link = self._links.get(peer)
        if link is not None:
            link.send(wire.Credit(target, count))

    def reply(self, peer: int, corr: int, value: object) -> None:
        """Send the answer to ``Ask`` number ``corr`` back to ``peer``."""
        link = self._links.get(peer)
        if link is None:
            return
        buffers: list[Any] = []
        try:
            body = msgspec.Raw(link.encoder.encode_into(value, buffers))
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            link.send(wire.Failure(corr, *error_to_wire(exc)))
            return
        link.send(wire.Reply(corr, body), buffers)

    def reply_error(self, peer: int, corr: int, error: BaseException) -> None:
        """Send the exception raised for ``Ask`` number ``corr`` back to ``peer``."""
        link = self._links.get(peer)
        if link is not None:
            link.send(wire.Failure(corr, *error_to_wire(error)))

    # -- receiving ------------------------------------------------------------------

    def _on_readable(self) -> None:
        """Drain the inbox; called by the loop when its (edge-triggered) FD fires.

        Reading synchronously in the FD callback costs no task switch per frame; the
        loop must drain until ``Again``, or a frame could wait for the next edge.
        """
        inbox = self._inbox
        decode = self._wire_decoder.decode
        while True:
            try:
                if not int(inbox.get(zmq.EVENTS)) & _POLLIN:
                    return
                frames = inbox.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:
                return  # closed under us during shutdown, or a spurious wake-up
            try:
                envelope = decode(frames[0].buffer)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("node %d dropped a malformed frame: %s", self.node_id, exc)
                continue
            buffers = [frame.buffer for frame in frames[1:]]
            try:
                self._dispatch(envelope, buffers)
            except Exception:
                # One bad frame must never stop the inbox.
                log.exception("node %d failed to handle %s", self.node_id, type(envelope))

    def _dispatch(self, envelope: wire.WireMessage, buffers: list[memoryview]) -> None:
        match envelope:
            case wire.Tell() | wire.Ask():
                self._deliver(envelope, buffers)
            case wire.Credit(target=target, grant=grant):
                for (_, flow_target), mailbox in self._flows.items():
                    if flow_target == target:
                        mailbox.add_credits(grant)
            case wire.Reply(corr=corr, body=body):
                entry = self._asks.get(corr)
                if entry is not None and not entry[0].done():
                    reply, reply_decoder, _ = entry
                    try:
                        reply.set_result(reply_decoder.decode(body, buffers))
                    except ProtocolError as exc:
                        reply.set_exception(exc)
            case wire.Failure(corr=corr, error_type=error_type, message=message):
                entry = self._asks.get(corr)
                if entry is not None and not entry[0].done():
                    entry[0].set_exception(error_from_wire(error_type, message))
            case wire.SlabOffer(node=peer, slab_id=slab_id, name=name):
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
        corr = envelope.corr if isinstance(envelope, wire.Ask) else None
        cell = self.system._registry.get(envelope.target)
        if cell is None or cell.mailbox.closed:
            self._release_slots(envelope.body)
            if corr is not None:
                self.reply_error(envelope.sender, corr, ActorStoppedError(envelope.target))
            return
        decoder = self._decoder_for(cell)
        try:
            message = decoder.decode(envelope.body, buffers)
        except ProtocolError as exc:
            log.warning("node %d: bad message for %s: %s", self.node_id, cell.path, exc)
            self._release_slots(envelope.body)
            if corr is not None:
                self.reply_error(envelope.sender, corr, exc)
            self.grant(envelope.sender, envelope.target)
            return
        if decoder.type is Any:
            self._release_slots(envelope.body)  # untyped: no tensor was built over a slot
        reply = RemoteReply(self, envelope.sender, envelope.target, corr)
        cell.mailbox.push_remote((message, reply))

    def _release_slots(self, body: msgspec.Raw) -> None:
        """Give back the slab slots of a message that is dropped undecoded.

        The sender filled them; without this they would stay busy forever.
        """
        try:
            stack: list[Any] = [msgspec.msgpack.decode(body)]
        except msgspec.DecodeError:
            return
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                if len(item) == _DESC_FIELDS and item[0] == _DESC_TAG:
                    slab, slot = item[_DESC_SLAB], item[_DESC_SLAB + 1]
                    if isinstance(slab, int) and isinstance(slot, int) and slab >= 0:
                        self.slabs.release(slab, slot)
                else:
                    stack.extend(item)
            elif isinstance(item, dict):
                stack.extend(item.values())

    def _decoder_for(self, cell: ActorCell) -> Decoder[Any]:
        accepts = cell.accepts
        if accepts == (object,):
            return self._decoder(Any)
        return self._decoder(typing.Union[accepts])  # noqa: UP007 - runtime union of a tuple

    def _decoder(self, type_: Any) -> Decoder[Any]:
        decoder = self._decoders.get(type_)
        if decoder is None:
            decoder = Decoder(type_, slab_reader=self.slabs)
            self._decoders[type_] = decoder
        return decoder
