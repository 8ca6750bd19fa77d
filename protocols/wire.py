"""Envelopes exchanged between nodes (processes) — the runtime's own wire protocol.

A frame on the wire is ``[header, *buffers]``: ``header`` is one of the structs below,
msgpack-encoded; ``buffers`` carry tensor bytes out of band. A ``Batch`` frame carries
several envelopes without buffers that one link sent within one turn of its event loop.
A user message travels pre-encoded inside ``Tell.body`` / ``Ask.body`` so the receiving
node can decode it against the *target actor's* declared message union, not a global
one.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "VERSION",
    "ActorExited",
    "ActorGone",
    "ActorMoved",
    "ActorStarted",
    "Ask",
    "AskFailure",
    "AskReply",
    "Batch",
    "Credit",
    "FlowClosed",
    "NodeDown",
    "OpenFlow",
    "PeerKeys",
    "RefDesc",
    "Hello",
    "Shutdown",
    "Single",
    "SlabAttached",
    "SlabOffer",
    "SpawnActor",
    "Tell",
    "WireMessage",
]


VERSION = 10
"""The wire protocol's version, announced in ``Hello``: bump it on any change to the
structs below (or to how messages and tensors are encoded), so that two processes of
different releases refuse each other at the handshake instead of misreading frames."""


class Tell(msgspec.Struct, tag="tell", frozen=True, array_like=True):
    """A one-way message to the actor ``target`` on the receiving node.

    ``seq`` numbers the user messages (``Tell`` and ``Ask``) of one link from 1 up: the
    receiver refuses one it has seen already, so a replayed frame is never handled twice.
    """

    target: str
    sender: int
    seq: int
    body: msgspec.Raw


class Ask(msgspec.Struct, tag="ask", frozen=True, array_like=True):
    """A request; the receiving node answers ``AskReply`` or ``AskFailure`` with ``corr``.

    ``seq`` is numbered with the link's ``Tell`` frames (see there).
    """

    target: str
    sender: int
    seq: int
    corr: int
    body: msgspec.Raw


class AskReply(msgspec.Struct, tag="reply", frozen=True, array_like=True):
    """The value an actor's ``receive`` returned for ``Ask`` number ``corr``."""

    corr: int
    body: msgspec.Raw


class AskFailure(msgspec.Struct, tag="failure", frozen=True, array_like=True):
    """An exception raised for ``Ask`` number ``corr`` (type by qualified name)."""

    corr: int
    error_type: str
    message: str


class Credit(msgspec.Struct, tag="credit", frozen=True, array_like=True):
    """Receiver node ``node`` → sender: send up to ``limit`` messages to ``target`` in all.

    ``limit`` counts from the start of the flow (the messages the receiver has handled
    plus its window), as TCP acknowledges a position, not an amount: a replayed or
    reordered grant can only repeat a limit already known, never add credits.
    """

    node: int
    target: str
    limit: int


class RefDesc(msgspec.Struct, tag="R", frozen=True, array_like=True):
    """An ``ActorRef`` inside a message: the actor ``path`` on node ``node``."""

    node: int
    endpoint: str
    path: str


class OpenFlow(msgspec.Struct, tag="open", frozen=True, array_like=True):
    """Sender → receiver: about to send to ``target``; grant credits (reply to ``endpoint``)."""

    sender: int
    endpoint: str
    target: str


class FlowClosed(msgspec.Struct, tag="closed", frozen=True, array_like=True):
    """Receiver → sender: ``target`` does not exist (any more) on node ``node``."""

    node: int
    target: str


class NodeDown(msgspec.Struct, tag="down", frozen=True, array_like=True):
    """Parent → workers: node ``node`` died; fail everything addressed to it.

    Except refs to ``actor``, the process actor it hosted (empty: none), which its
    supervisor may restart in another worker: they hold their senders until an
    ``ActorMoved`` or ``ActorGone`` for it, ``wait_s`` at most. ``stopped``: it was
    stopped on purpose (a shutdown): what it had not taken was dropped by design, not
    lost, and is not counted.
    """

    node: int
    reason: str
    actor: str = ""
    wait_s: float = 0.0
    stopped: bool = False


class ActorMoved(msgspec.Struct, tag="moved", frozen=True, array_like=True):
    """Parent → workers: the process actor ``path`` of dead node ``node`` was restarted
    and now lives at ``to``: refs to its old place follow it."""

    node: int
    path: str
    to: RefDesc


class ActorGone(msgspec.Struct, tag="gone", frozen=True, array_like=True):
    """Parent → workers: the process actor ``path``, last on node ``node``, stopped for
    good (``reason`` says why): refs to it fail."""

    node: int
    path: str
    reason: str


class Hello(msgspec.Struct, tag="hello", frozen=True, array_like=True):
    """Worker → parent, once its node is listening; the parent checks ``version`` first.

    ``version`` stays the first field in every version, and later versions only append
    fields (with defaults), so any two releases can read each other's ``Hello`` — and
    name both versions in the error — whatever else changed.
    """

    version: int
    node: int
    pid: int
    endpoint: str


class SpawnActor(msgspec.Struct, tag="spawn", frozen=True, array_like=True, kw_only=True):
    """Parent → worker: start ``actor`` (``"module:QualName"``) under ``name``."""

    actor: str
    name: str
    args: msgspec.Raw
    kwargs: msgspec.Raw
    capacity: int
    overflow: str
    stash_capacity: int


class ActorStarted(msgspec.Struct, tag="started", frozen=True, array_like=True):
    """Worker → parent: ``name`` is running; the sender may have ``credits`` in flight."""

    node: int
    name: str
    credits: int


class ActorExited(msgspec.Struct, tag="exited", frozen=True, array_like=True):
    """Worker → parent: ``name`` stopped; ``error_type`` is empty after a normal stop."""

    node: int
    name: str
    error_type: str
    message: str


class SlabOffer(msgspec.Struct, tag="slab", frozen=True, array_like=True):
    """Sender → receiver: map shared-memory slab ``name``; large tensors will use it."""

    node: int
    slab_id: int
    name: str


class SlabAttached(msgspec.Struct, tag="slab_ok", frozen=True, array_like=True):
    """Receiver → sender: the slab is mapped, so its name can be unlinked now."""

    node: int
    slab_id: int


class Shutdown(msgspec.Struct, tag="shutdown", frozen=True, array_like=True):
    """Parent → worker: stop every actor and exit."""


class PeerKeys(msgspec.Struct, tag="keys", frozen=True, array_like=True):
    """Parent → workers over TCP: the CURVE public keys (Z85) of nodes, by node id.

    A node links to and admits only nodes whose key it holds. A new worker gets every
    key; the others get the new worker's, before any ref to its actor exists.
    """

    keys: dict[int, str]


# Every envelope but a batch: what a batch holds.
Single = (
    Tell
    | Ask
    | AskReply
    | AskFailure
    | Credit
    | OpenFlow
    | FlowClosed
    | NodeDown
    | ActorMoved
    | ActorGone
    | Hello
    | SpawnActor
    | ActorStarted
    | ActorExited
    | SlabOffer
    | SlabAttached
    | Shutdown
    | PeerKeys
)


class Batch(msgspec.Struct, tag="batch", frozen=True, array_like=True):
    """Envelopes one link sent within one turn of the event loop, in order, in one frame:
    a send and a receive per turn instead of one per envelope. Only envelopes without
    out-of-band buffers go in one; a batch never holds a batch."""

    messages: list[Single]


WireMessage = Single | Batch
"""What a frame's header decodes to: one envelope, or a batch of them."""
