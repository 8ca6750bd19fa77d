"""Nodes in one process: delivery, hostile frames, TCP with CURVE authentication."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest
import torch
import zmq
from remote_actors import Payload, Relay

from omni_actors import ActorRef, ActorSystem, MailboxConfig
from omni_actors.protocols import wire
from omni_actors.testing import ActorTestKit, eventually
from omni_actors.transport.codec import Encoder
from omni_actors.transport.endpoints import CurveKeys, RuntimeDir
from omni_actors.transport.node import Node
from omni_actors.transport.remote import RemoteMailbox


@asynccontextmanager
async def _nodes(
    receiver_endpoint: str,
    *,
    receiver_keys: CurveKeys | None = None,
    sender_keys: CurveKeys | None = None,
) -> AsyncIterator[tuple[ActorTestKit, Node, Node]]:
    async with ActorTestKit() as kit:
        receiver = Node(kit.system, 1, receiver_endpoint, curve=receiver_keys)
        sender = Node(ActorSystem(), 2, "inproc://unused-sender", curve=sender_keys)
        await receiver.start()
        try:
            yield kit, receiver, sender
        finally:
            await receiver.close()
            await sender.close()


@asynccontextmanager
async def _ipc_nodes() -> AsyncIterator[tuple[ActorTestKit, Node, Node]]:
    """Two nodes over IPC in a private runtime directory, removed afterwards."""
    rundir = RuntimeDir()
    try:
        async with _nodes(rundir.endpoint(1)) as nodes:
            yield nodes
    finally:
        rundir.cleanup()


async def _remote_ref(
    sender: Node, receiver: Node, target: ActorRef[object], **connect: bytes
) -> RemoteMailbox:
    link = sender.connect(1, receiver.endpoint, **connect)
    # The receiver links back, as it would on the sender's OpenFlow: a node only takes
    # user messages from nodes it has a link to.
    receiver.connect(sender.node_id, sender.endpoint)
    mailbox = RemoteMailbox("/remote", MailboxConfig(), object)  # the targets' default
    mailbox.bind(sender, link, target.path, credits=8)
    return mailbox


async def test_ipc_delivery_to_a_local_actor() -> None:
    async with _ipc_nodes() as (kit, receiver, sender):
        probe = await kit.create_probe()
        mailbox = await _remote_ref(sender, receiver, probe.ref)
        await mailbox.push_user(({"hello": [1, 2]}, None))
        assert await probe.expect_message(dict) == {"hello": [1, 2]}


async def test_malformed_frames_are_dropped_and_the_inbox_keeps_working() -> None:
    async with _ipc_nodes() as (kit, receiver, sender):
        probe = await kit.create_probe()
        relay = await kit.spawn(Relay, probe.ref)
        mailbox = await _remote_ref(sender, receiver, relay)
        link = sender.link(1)
        raw = link.socket

        def tell(target: str, body: bytes) -> bytes:
            link.seq += 1  # numbered as the link numbers its own: not a replay
            return msgspec.msgpack.encode(wire.Tell(target, 2, link.seq, msgspec.Raw(body)))

        raw.send(b"\xc1 not msgpack")
        raw.send_multipart([msgspec.msgpack.encode(["tell"]), b"extra"])
        body = msgspec.msgpack.encode({"lying": ["T", 0, "float32", [1000], None, 0]})
        raw.send(tell(relay.path, body))
        # A descriptor for 1000 floats with a 3-byte buffer behind it.
        lying = Encoder(inline_threshold=0).encode_into(Payload(1, torch.zeros(1000)), [])
        raw.send_multipart([tell(relay.path, lying), b"x" * 3])
        raw.send(tell("/nobody", b"\x01"))
        await mailbox.push_user((Payload(2, torch.ones(3)), None))
        received = await probe.expect_message(Payload)
        assert received.seq == 2
        assert torch.equal(received.data, torch.ones(3))


async def test_tcp_with_curve_delivers_tensors() -> None:
    client = CurveKeys.generate()
    server = CurveKeys.generate(peers=(client.public,))
    async with _nodes("tcp://127.0.0.1:*", receiver_keys=server, sender_keys=client) as (
        kit,
        receiver,
        sender,
    ):
        probe = await kit.create_probe()
        relay = await kit.spawn(Relay, probe.ref)
        mailbox = await _remote_ref(sender, receiver, relay, server_public=server.public)
        data = torch.arange(100_000, dtype=torch.float32)
        await mailbox.push_user((Payload(7, data), None))
        message = await probe.expect_message(Payload, timeout=5)
        assert torch.equal(message.data, data)


async def test_curve_rejects_unknown_clients() -> None:
    allowed = CurveKeys.generate()
    server = CurveKeys.generate(peers=(allowed.public,))
    intruder = CurveKeys.generate()
    async with _nodes("tcp://127.0.0.1:*", receiver_keys=server, sender_keys=intruder) as (
        kit,
        receiver,
        sender,
    ):
        probe = await kit.create_probe()
        mailbox = await _remote_ref(sender, receiver, probe.ref, server_public=server.public)
        await mailbox.push_user(("let me in", None))
        refused = receiver.refusals.counts
        await eventually(lambda: refused["connection without the key of a deployment node"])
        await probe.expect_no_message(0.2)


async def test_curve_admits_a_key_learned_later_and_forgets_it_with_its_node() -> None:
    server = CurveKeys.generate()
    client = CurveKeys.generate()
    async with _nodes("tcp://127.0.0.1:*", receiver_keys=server, sender_keys=client) as (
        kit,
        receiver,
        sender,
    ):
        receiver.peer_keys.add(sender.node_id, client.public)
        probe = await kit.create_probe()
        mailbox = await _remote_ref(sender, receiver, probe.ref, server_public=server.public)
        await mailbox.push_user(("known", None))
        assert await probe.expect_message(str, timeout=5) == "known"
        receiver.disconnect(sender.node_id, ConnectionError("it left"))
        assert client.public not in receiver.peer_keys.values()


def test_tcp_link_without_keys_is_refused() -> None:
    async def scenario() -> None:
        async with ActorSystem() as system:
            node = Node(system, 3, "inproc://x")
            try:
                with pytest.raises(ValueError, match="CurveKeys"):
                    node.connect(4, "tcp://127.0.0.1:5555")
            finally:
                await node.close()

    asyncio.run(scenario())


def test_curve_is_available() -> None:
    assert zmq.has("curve")


async def test_dropped_messages_give_their_slab_slots_back() -> None:
    async with _ipc_nodes() as (kit, receiver, sender):
        probe = await kit.create_probe()
        relay = await kit.spawn(Relay, probe.ref)
        mailbox = await _remote_ref(sender, receiver, relay)
        link = sender.link(1)
        assert link.slab is not None
        big = torch.zeros(1 << 19)  # 2 MiB: placed in the slab
        # To an actor that does not exist: dropped without decoding.
        link.send_message("/nobody", Payload(1, big))
        # To an actor that accepts Any: decoded untyped, no tensor over the slot.
        link.send_message(probe.ref.path, Payload(2, big))
        await probe.expect_message(dict)
        slab = link.slab
        await eventually(lambda: slab.busy() == 0, what="both dropped slots returned")
        # A delivered one is held while the actor keeps the tensor, then freed.
        await mailbox.push_user((Payload(3, big), None))
        received = await probe.expect_message(Payload)
        assert link.slab.busy() == 1
        del received
        import gc

        gc.collect()
        assert link.slab.busy() == 0


async def test_deeply_nested_frames_do_not_stop_the_inbox() -> None:
    async with _ipc_nodes() as (kit, receiver, sender):
        probe = await kit.create_probe()
        relay = await kit.spawn(Relay, probe.ref)
        mailbox = await _remote_ref(sender, receiver, relay)
        sender.link(1).socket.send(b"\x91" * 5000 + b"\xc0")  # lists nested 5000 deep
        await mailbox.push_user((Payload(9, torch.ones(2)), None))
        assert (await probe.expect_message(Payload)).seq == 9
