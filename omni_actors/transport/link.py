"""``Link``: the sending half of a connection from one node to a peer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from omni_actors.protocols import wire
from omni_actors.transport.codec import Encoder
from omni_actors.transport.shm import SlabWriter

if TYPE_CHECKING:
    from omni_actors.transport.node import Node

__all__ = ["Link"]

_wire_encoder = msgspec.msgpack.Encoder()
_BATCH = 256  # envelopes held at most before they go


class _Batch(msgspec.Struct, tag="batch", frozen=True, array_like=True):
    """``wire.Batch`` as sent: its envelopes already encoded."""

    messages: list[msgspec.Raw]


class Link:
    """The sending half of a connection from this node to one peer."""

    def __init__(self, node: Node, peer: int, endpoint: str, socket: zmq.Socket[bytes]) -> None:
        self.node = node
        self.peer = peer
        self.endpoint = endpoint
        self.socket = socket
        self.slab: SlabWriter | None = None
        self.seq = 0  # the last user message's number on this link (see ``wire.Tell``)
        self.encoder = Encoder(slab_threshold=node.shm_threshold, ref_hook=node.encode_ref)
        # Envelopes held for the end of this turn of the loop; None: none sent this turn.
        self._held: list[msgspec.Raw] | None = None

    def use_slab(self, slab: SlabWriter) -> None:
        """Route large tensors through ``slab`` (offered to the peer right away)."""
        self.slab = slab
        self.encoder = Encoder(
            slab_writer=slab, slab_threshold=self.node.shm_threshold, ref_hook=self.node.encode_ref
        )
        self.send(wire.SlabOffer(self.node.node_id, slab.slab_id, slab.name))

    def send(self, envelope: wire.WireMessage, buffers: Sequence[Any] = ()) -> None:
        """Send ``envelope`` (``buffers``: its out-of-band frames) without blocking (see
        the module docstring for the bound).

        The first envelope of a turn of the event loop goes at once. Those after it in
        the same turn are held and leave together, as one ``wire.Batch`` frame, when
        the turn ends: one send and one receive per turn instead of one per envelope,
        where a busy loop sends dozens per turn. An envelope with buffers never joins
        a batch; what is held goes before it, so the peer sees the order of the calls.
        """
        header = _wire_encoder.encode(envelope)
        socket = self.socket
        if not buffers:
            held = self._held
            if held is not None:
                held.append(msgspec.Raw(header))
                if len(held) >= _BATCH:
                    self._send_held(held)
                return
            socket.send(header)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop turn to wait for: every envelope goes at once
                return
            self._held = []
            loop.call_soon(self._flush)  # after the callbacks ready in this turn
            return
        if self._held:
            self._send_held(self._held)
        # The send contract: once ``tell`` returns, the sender may change what it sent.
        # A ``copy=False`` frame is read by ZeroMQ's I/O thread *after* ``send``
        # returns (a 256 KiB tensor zeroed right after ``tell`` arrived all zeros), so
        # every buffer is copied here, once, as the shared-memory slab copies into its
        # slot; the receiver still builds its tensor over the frame without a copy.
        # Holding the tensor until a ``MessageTracker`` fires would keep the contract
        # only if ``tell`` waited for the peer to drain the frame, and costs a
        # free-callback round trip through pyzmq's garbage thread per frame; the copy
        # costs a memcpy (64 KiB: 3 us, 1 MiB: 40 us on the 2-core CI machine) and
        # ``bench transport`` measured the 64 KiB round trip no slower with it.
        socket.send(header, zmq.SNDMORE)
        last = len(buffers) - 1
        for i, buffer in enumerate(buffers):
            socket.send(buffer, zmq.SNDMORE if i < last else 0, copy=True)

    def _flush(self) -> None:
        """The turn ended: what was held goes, and the next envelope goes at once."""
        held, self._held = self._held, None
        if held:
            self._send_held(held)

    def _send_held(self, held: list[msgspec.Raw]) -> None:
        frame = _wire_encoder.encode(_Batch(held)) if len(held) > 1 else bytes(held[0])
        held.clear()
        self.socket.send(frame)

    def send_message(self, target: str, message: object, corr: int | None = None) -> None:
        """Encode a user message for ``target`` on the peer and send it."""
        buffers: list[Any] = []
        body = msgspec.Raw(self.encoder.encode_into(message, buffers))
        sender = self.node.node_id
        # Numbered only once encoded: a message that failed to encode leaves no gap.
        self.seq = seq = self.seq + 1
        envelope: wire.WireMessage = (
            wire.Tell(target, sender, seq, body)
            if corr is None
            else wire.Ask(target, sender, seq, corr, body)
        )
        self.send(envelope, buffers)

    def close(self) -> None:
        """Close the socket (pending frames are dropped) and release the slab."""
        self._flush()
        self.socket.close(linger=0)
        if self.slab is not None:
            self.slab.close()
            self.slab = None
