"""``RemoteRefs``: the actors of other nodes this node knows from refs in messages.

A ref that arrives inside a message names the node its actor lives on (``RefDesc``) and
becomes a :class:`~omni_actors.transport.remote.RemoteTarget`. It lives as long as its
actor: closed when the actor's node says it is gone (``FlowClosed``) or the parent says
the node died (``NodeDown``) — its senders then raise ``ActorStoppedError``.

But a process actor outlives its worker: when the worker dies, the actor's supervisor
(in the parent) may restart it in a new one. The parent's own ref follows (its mailbox
is bound again); refs held elsewhere follow through three messages from the parent:

- ``NodeDown(actor=path, wait_s)``: the worker died with ``path`` on it. Refs to that
  actor are *held*: unbound, so their senders wait, as for a full mailbox (each within
  its own timeout, all within ``wait_s``), rather than fail.
- ``ActorMoved``: it runs again elsewhere. Held refs are bound to the new place (their
  flow opens afresh: credits come from the new node), and refs to the old place that
  arrive later resolve to the new one.
- ``ActorGone``: it stopped for good, or its supervisor gave up: held refs close.

Asks already sent to the dead worker fail at once (``Node.disconnect``); only what is
sent after holds. What was sent before the ``NodeDown`` arrived may be lost with the
worker: that is counted (``Node.count_lost``), as before.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_actors.errors import ActorStoppedError
from omni_actors.protocols import wire
from omni_actors.transport.remote import RemoteMailbox, RemoteTarget

if TYPE_CHECKING:
    from omni_actors import ActorRef
    from omni_actors.transport.node import Node

__all__ = ["RemoteRefs"]

log = logging.getLogger(__name__)

_Key = tuple[int, str]  # (node, path there)


@dataclass(slots=True)
class _Held:
    """A restarting actor whose ref (if one arrived yet) waits for its new place."""

    deadline: asyncio.TimerHandle
    target: RemoteTarget | None = None


class RemoteRefs:
    """The :class:`RemoteTarget` of each actor of another node that a ref named here."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._targets: dict[_Key, RemoteTarget] = {}
        self._dead: dict[int, BaseException] = {}  # refs to these are dead on arrival
        self._held: dict[_Key, _Held] = {}
        self._moved: dict[_Key, wire.RefDesc] = {}  # where a restarted actor went

    def decode(self, desc: wire.RefDesc) -> ActorRef[Any]:
        """The ref for ``desc``, an actor of another node: known, new, held or dead."""
        target = self._targets.get((desc.node, desc.path))
        if target is not None and not target.closed:
            return target.ref
        dead = self._dead.get(desc.node)
        if dead is not None:
            return self._resolve(desc, dead)
        target = RemoteTarget(self._node, desc.node, desc.endpoint, desc.path)
        self._open(target, desc)
        return target.ref

    def holds(self, mailbox: RemoteMailbox) -> bool:
        """Whether ``mailbox`` is a held ref's (unbound, but its actor may come back)."""
        return any(h.target is not None and h.target.remote is mailbox for h in self._held.values())

    def flow_closed(self, peer: int, path: str) -> None:
        """``path`` does not exist on ``peer`` (any more): its ref fails."""
        closed = self._targets.pop((peer, path), None)
        if closed is not None:
            closed.close(ActorStoppedError(f"{path} on node {peer}"))

    def node_down(self, down: wire.NodeDown, error: BaseException) -> None:
        """The parent says node ``down.node`` died; call before ``forget_node``.

        Refs to the process actor it hosted are held for its next worker from then on,
        ``down.wait_s`` at most; the rest fail.
        """
        self._dead[down.node] = error
        key = (down.node, down.actor)
        if down.actor and down.wait_s > 0 and key not in self._held:
            timer = asyncio.get_running_loop().call_later(down.wait_s, self._expire, key, down)
            self._held[key] = _Held(timer)

    def forget_node(self, peer: int, error: BaseException) -> None:
        """``peer`` is gone: its refs fail with ``error``, but for a held actor's."""
        for key in [k for k in self._targets if k[0] == peer]:
            target = self._targets.pop(key)
            held = self._held.get(key)
            if held is None:
                target.close(error)
            else:
                target.remote.unbind()  # its senders wait for ``moved``
                held.target = target

    def moved(self, move: wire.ActorMoved) -> None:
        """The actor of a dead node was restarted at ``move.to``: its held ref follows."""
        key = (move.node, move.path)
        self._moved[key] = move.to
        held = self._held.pop(key, None)
        if held is None:
            return
        held.deadline.cancel()
        target = held.target
        if target is None or target.closed:
            return
        existing = self._targets.get((move.to.node, move.to.path))
        if existing is None or existing.closed:
            self._open(target, move.to)
            return
        # A ref to the new place arrived first (through another worker): one flow per
        # actor, so the held ref sends through that one and ends with it.
        target.remote.forward(existing.remote)
        existing.terminated.add_done_callback(functools.partial(_close_with, target))

    def gone(self, gone: wire.ActorGone) -> None:
        """The actor last on ``gone.node`` stopped for good: refs to it fail."""
        key = (gone.node, gone.path)
        error = ActorStoppedError(f"{gone.path} on node {gone.node}", gone.reason)
        held = self._held.pop(key, None)
        if held is not None:
            held.deadline.cancel()
            if held.target is not None:
                held.target.close(error)
        # Stopped with its worker still up (its host was killed): fail live refs too.
        live = self._targets.pop(key, None)
        if live is not None:
            live.close(error)

    def close(self, error: BaseException) -> None:
        """The node is closing: every ref fails (no sender is left waiting)."""
        held, self._held = self._held, {}
        targets, self._targets = self._targets, {}
        for entry in held.values():
            entry.deadline.cancel()
            if entry.target is not None:
                entry.target.close(error)
        for target in targets.values():
            target.close(error)

    def _open(self, target: RemoteTarget, desc: wire.RefDesc) -> None:
        """Bind ``target`` to ``desc``'s actor; its node grants credits on ``OpenFlow``."""
        node = self._node
        link = node.connect(desc.node, desc.endpoint)
        target.bind(link, desc.path)
        self._targets[(desc.node, desc.path)] = target
        link.send(wire.OpenFlow(node.node_id, node.endpoint, desc.path))

    def _resolve(self, desc: wire.RefDesc, dead: BaseException) -> ActorRef[Any]:
        """A ref to ``desc``, whose node is dead: where its actor went, held, or closed."""
        key, to = (desc.node, desc.path), None
        while (step := self._moved.get(key)) is not None:  # it may have moved on since
            to, key = step, (step.node, step.path)
        if to is not None:
            return self._node.decode_ref(to)
        held = self._held.get(key)
        if held is None:
            target = RemoteTarget(self._node, desc.node, desc.endpoint, desc.path)
            target.close(dead)
            return target.ref
        if held.target is None or held.target.closed:
            # Unbound from the start: senders wait for the actor's new place.
            held.target = RemoteTarget(self._node, desc.node, desc.endpoint, desc.path)
        return held.target.ref

    def _expire(self, key: _Key, down: wire.NodeDown) -> None:
        held = self._held.pop(key, None)
        if held is None or held.target is None:
            return
        log.warning(
            "node %d: %s of dead node %d was not restarted within %gs; its refs fail",
            self._node.node_id,
            down.actor,
            down.node,
            down.wait_s,
        )
        held.target.close(
            ActorStoppedError(
                f"{down.actor} on node {down.node}",
                f"its worker died and it did not come back within {down.wait_s:g}s",
            )
        )


def _close_with(target: RemoteTarget, ended: asyncio.Future[BaseException | None]) -> None:
    """Close ``target`` as the ref it forwards to closed."""
    target.close(ended.result())
