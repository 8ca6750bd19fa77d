"""``RemoteRefs`` node by node, in one process: a held ref, and what ends its wait.

Nodes 1 and 3 both serve the test's system, so "the actor moved from node 1 to node 3"
needs no worker; node 0 plays the parent, node 2 holds the ref. The restart itself is
tested with real workers in ``test_moved_refs``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from omni_actors import ActorRef, ActorStoppedError, ActorSystem, remoting
from omni_actors.protocols import wire
from omni_actors.testing import ActorTestKit, TestProbe
from omni_actors.transport.endpoints import RuntimeDir
from omni_actors.transport.node import Node


@dataclass
class _Nodes:
    kit: ActorTestKit
    probe: TestProbe
    old: Node  # where the actor lived
    new: Node  # where it lives after the move
    holder: Node  # holds a ref to it
    parent: Node

    def desc(self, node: Node) -> wire.RefDesc:
        return wire.RefDesc(node.node_id, node.endpoint, self.probe.ref.path)

    def tell_holder(self, message: wire.WireMessage) -> None:
        self.parent.connect(self.holder.node_id, self.holder.endpoint).send(message)

    def node_down(self, wait_s: float = 30.0) -> None:
        path = self.probe.ref.path
        self.tell_holder(wire.NodeDown(self.old.node_id, "killed", path, wait_s))

    def moved(self) -> None:
        self.tell_holder(
            wire.ActorMoved(self.old.node_id, self.probe.ref.path, self.desc(self.new))
        )


@asynccontextmanager
async def _nodes() -> AsyncIterator[_Nodes]:
    rundir = RuntimeDir()
    try:
        async with ActorTestKit() as kit:
            probe = await kit.create_probe()
            nodes = [
                Node(kit.system, 1, rundir.endpoint(1)),
                Node(kit.system, 3, rundir.endpoint(3)),
                Node(ActorSystem(), 2, rundir.endpoint(2)),
                Node(ActorSystem(), 0, rundir.endpoint(0)),
            ]
            for node in nodes:
                await node.start()
            try:
                yield _Nodes(kit, probe, *nodes)
            finally:
                for node in nodes:
                    await node.close()
    finally:
        rundir.cleanup()


async def _held(nodes: _Nodes, ref: ActorRef[Any]) -> None:
    """Wait until the holder has taken the parent's ``NodeDown`` (its ref unbound)."""
    mailbox: Any = remoting.mailbox_of(ref)
    await nodes.kit.eventually(lambda: mailbox.link is None, what="the ref held")


async def test_a_held_ref_waits_then_follows_the_move() -> None:
    async with _nodes() as nodes:
        ref = nodes.holder.decode_ref(nodes.desc(nodes.old))
        await ref.tell("before", timeout=5)
        await nodes.probe.expect_message("before", timeout=5)
        nodes.node_down()
        await _held(nodes, ref)
        during = asyncio.ensure_future(ref.tell("during", timeout=10))
        await nodes.kit.consistently(lambda: not during.done(), 0.1, what="the send waits")
        nodes.moved()
        await during
        await nodes.probe.expect_message("during", timeout=5)
        assert remoting.mailbox_of(ref).link.peer == nodes.new.node_id  # type: ignore[attr-defined]
        # A ref to the old place that arrives now is the same ref, at the new place.
        assert nodes.holder.decode_ref(nodes.desc(nodes.old)) == ref


async def test_a_ref_to_the_old_place_arriving_during_the_restart_waits_too() -> None:
    async with _nodes() as nodes:
        nodes.node_down()
        await nodes.kit.eventually(lambda: nodes.old.node_id in nodes.holder.refs._dead)
        ref = nodes.holder.decode_ref(nodes.desc(nodes.old))  # held from the start
        during = asyncio.ensure_future(ref.tell("late", timeout=10))
        await nodes.kit.consistently(lambda: not during.done(), 0.1, what="the send waits")
        nodes.moved()
        await during
        await nodes.probe.expect_message("late", timeout=5)


async def test_a_held_ref_defers_to_a_ref_to_the_new_place_that_came_first() -> None:
    async with _nodes() as nodes:
        old_ref = nodes.holder.decode_ref(nodes.desc(nodes.old))
        nodes.node_down()
        await _held(nodes, old_ref)
        # Through another worker, a ref to where the actor lives now arrives first.
        new_ref = nodes.holder.decode_ref(nodes.desc(nodes.new))
        assert new_ref != old_ref
        during = asyncio.ensure_future(old_ref.tell("old", timeout=10))
        nodes.moved()
        await during
        await new_ref.tell("new", timeout=10)
        await nodes.probe.expect_message("old", timeout=5)
        await nodes.probe.expect_message("new", timeout=5)
        assert nodes.holder.decode_ref(nodes.desc(nodes.old)) == new_ref


async def test_a_held_ref_fails_when_the_actor_is_gone() -> None:
    async with _nodes() as nodes:
        ref = nodes.holder.decode_ref(nodes.desc(nodes.old))
        nodes.node_down()
        await _held(nodes, ref)
        during = asyncio.ensure_future(ref.tell("never", timeout=10))
        await nodes.kit.consistently(lambda: not during.done(), 0.1, what="the send waits")
        path = nodes.probe.ref.path
        nodes.tell_holder(wire.ActorGone(nodes.old.node_id, path, "it stopped"))
        with pytest.raises(ActorStoppedError):
            await during
        assert "it stopped" in str(remoting.terminated(ref).result())
        with pytest.raises(ActorStoppedError):
            await ref.tell("after", timeout=10)
        await nodes.probe.expect_no_message(0.1)


async def test_a_held_ref_fails_when_the_actor_does_not_come_back_in_time() -> None:
    async with _nodes() as nodes:
        ref = nodes.holder.decode_ref(nodes.desc(nodes.old))
        nodes.node_down(wait_s=0.3)
        await _held(nodes, ref)
        with pytest.raises(ActorStoppedError):
            await ref.tell("never", timeout=10)
        assert "did not come back within 0.3s" in str(remoting.terminated(ref).result())
        nodes.moved()  # too late: nothing waits for it any more
        with pytest.raises(ActorStoppedError):
            await ref.tell("after", timeout=10)
        await nodes.probe.expect_no_message(0.1)


async def test_refs_to_other_actors_of_the_dead_node_fail_at_once() -> None:
    async with _nodes() as nodes:
        other = await nodes.kit.create_probe()
        ref = nodes.holder.decode_ref(wire.RefDesc(1, nodes.old.endpoint, other.ref.path))
        nodes.node_down()
        await nodes.kit.eventually(lambda: not ref.is_alive, what="the ref closed")
        with pytest.raises(ActorStoppedError):
            await ref.tell("never", timeout=10)
        assert "killed" in str(remoting.terminated(ref).result())


async def test_messages_a_dead_node_never_confirmed_are_counted_once() -> None:
    async with _nodes() as nodes:
        ref = nodes.holder.decode_ref(nodes.desc(nodes.old))
        for n in range(3):
            await ref.tell(n, timeout=5)
        for n in range(3):
            await nodes.probe.expect_message(n, timeout=5)
        # Taken, but not said to be (credits come back a quarter mailbox at a time).
        nodes.node_down()
        await _held(nodes, ref)
        assert nodes.holder.lost == 3
