"""``InboxGuard``: which user messages and flows a node accepts from the wire.

Cheap, O(1) checks on frames that decoded as valid envelopes, made before anything
reaches an actor:

- a user message (``Tell``/``Ask``) must come from a node this one has a link to: every
  real sender opened its flow first (the receiver links back to answer it) or is the
  parent, so a frame naming any other node is not from a peer;
- its ``seq`` must be above the last one seen from that node: a replayed frame is never
  handled twice (a link numbers its user messages from 1, and ZeroMQ keeps their order);
- an ``OpenFlow`` from a node with no link must name an endpoint beside this node's own
  (the deployment's runtime directory), unless CURVE has authenticated it (a node of
  another host): answering it costs a socket and a slab, which a stranger must not be
  able to make the node spend.
"""

from __future__ import annotations

import os

from omni_actors.protocols import wire
from omni_actors.transport.refusals import Refusals

__all__ = ["InboxGuard"]


class InboxGuard:
    """The checks of one node's inbox, and the count of what they refused."""

    __slots__ = ("_seen", "refusals")

    def __init__(self, node_id: int) -> None:
        self.refusals = Refusals(node_id)
        self._seen: dict[int, int] = {}  # the last user message's seq from each peer

    def admit_message(self, envelope: wire.Tell | wire.Ask, linked: bool) -> bool:
        """Whether to deliver a user message (``linked``: its sender has a link here)."""
        sender = envelope.sender
        if not linked:
            self.refusals.refuse("user message from a node with no link", envelope.target)
            return False
        seq = envelope.seq
        if seq <= self._seen.get(sender, 0):
            self.refusals.refuse("replayed user message", f"seq {seq} from node {sender}")
            return False
        self._seen[sender] = seq
        return True

    def admit_flow(self, request: wire.OpenFlow, linked: bool, own_endpoint: str) -> bool:
        """Whether to answer an ``OpenFlow`` (``linked``: its sender has a link here)."""
        if linked or _beside(request.endpoint, own_endpoint):
            return True
        self.refusals.refuse("flow from an unknown node elsewhere", request)
        return False

    def forget_peer(self, peer: int) -> None:
        """``peer`` is gone: drop what was remembered of it."""
        self._seen.pop(peer, None)


def _beside(endpoint: str, own: str) -> bool:
    """Whether ``endpoint`` is an IPC endpoint in the directory of ``own``."""
    return (
        own.startswith("ipc://")
        and endpoint.startswith("ipc://")
        and os.path.dirname(endpoint) == os.path.dirname(own)
    )
