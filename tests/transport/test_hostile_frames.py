"""Hostile frames at a node's inbox: strangers, spoofed senders, replays, a peer that
stops reading. Each is refused (and counted) while the node keeps serving its peers."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import msgspec
import pytest
import torch
import zmq
from node_pair import node_pair
from remote_actors import Block, Count, Echo, Payload, Pid, Relay

from omni_actors import (
    ActorRef,
    AskTimeoutError,
    MailboxConfig,
    Props,
    SendTimeoutError,
)
from omni_actors.protocols import wire
from omni_actors.testing import ActorTestKit, eventually
from omni_actors.transport.codec import Encoder
from omni_actors.transport.node import Node
from omni_actors.transport.process_placement import ProcessPlacement
from omni_actors.transport.remote import RemoteMailbox

TOKEN = b"0123456789abcdef0123456789abcdef"


class Pair:
    """Node 1 (receiving, with a relay to a probe) and node 2 (sending), linked both ways."""

    def __init__(self, kit: ActorTestKit, receiver: Node, sender: Node) -> None:
        self.kit, self.receiver, self.sender = kit, receiver, sender

    async def flow(self, relay: ActorRef[Any]) -> RemoteMailbox:
        """A flow from node 2 to ``relay``, opened as a ref in a message opens one."""
        ref = self.sender.decode_ref(wire.RefDesc(1, self.receiver.endpoint, relay.path))
        mailbox = self.sender._flows[(1, relay.path)]
        await eventually(lambda: mailbox.credits > 0, what="the flow's first grant")
        assert ref is mailbox.ref
        return mailbox

    def forge(self, target: str, body: bytes, seq: int) -> bytes:
        """A ``Tell`` header as node 2 would send it."""
        return msgspec.msgpack.encode(wire.Tell(target, 2, seq, msgspec.Raw(body)))


@asynccontextmanager
async def _pair(token: bytes | None) -> AsyncIterator[Pair]:
    async with node_pair(token) as (kit, receiver, sender):
        sender.connect(1, receiver.endpoint)
        yield Pair(kit, receiver, sender)


@contextmanager
def _stranger(endpoint: str, *, password: bytes | None = None) -> Iterator[zmq.Socket[bytes]]:
    """A raw PUSH socket of a process that is not a peer (same host, same user)."""
    ctx = zmq.Context()
    socket = ctx.socket(zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 0)
    if password is not None:
        socket.plain_username = b"2"
        socket.plain_password = password
    socket.connect(endpoint)
    try:
        yield socket
    finally:
        socket.close(linger=0)
        ctx.term()


def _hostile_frames(pair: Pair, relay: ActorRef[Any]) -> list[list[bytes]]:
    """Garbage; a ``Tell`` from a node nobody knows; one spoofing the real peer, node 2."""
    body = Encoder().encode_into(Payload(666, torch.ones(1)), [])  # tensor inline
    unknown = msgspec.msgpack.encode(wire.Tell(relay.path, 99, 1, msgspec.Raw(body)))
    return [[b"\xc1 garbage"], [unknown], [pair.forge(relay.path, body, 10**6)]]


# -- 1. frames from a process that is not a peer -------------------------------------------


async def test_a_process_without_the_deployment_token_gets_no_frame_to_an_actor() -> None:
    async with _pair(TOKEN) as pair:
        probe = await pair.kit.create_probe()
        relay = await pair.kit.spawn(Relay, probe.ref)
        flow = await pair.flow(relay)
        refused = pair.receiver.refusals.counts
        for password in (None, b"not the token"):
            with _stranger(pair.receiver.endpoint, password=password) as stranger:
                for frames in _hostile_frames(pair, relay):
                    stranger.send_multipart(frames)
                if password is not None:  # refused at the handshake, and counted
                    await eventually(lambda: refused["connection without the deployment token"])
        # The real peer goes on, and only its message arrives (the spoofed seq 10**6,
        # had it got in, would also make the node refuse this one as a replay).
        await flow.push_user((Payload(1, torch.ones(2)), None))
        assert (await probe.expect_message(Payload)).seq == 1
        await probe.expect_no_message(0.1)
        assert set(pair.receiver._links) == {2}


async def test_without_a_token_strangers_are_refused_by_the_inbox_checks() -> None:
    async with _pair(None) as pair:
        probe = await pair.kit.create_probe()
        relay = await pair.kit.spawn(Relay, probe.ref)
        flow = await pair.flow(relay)
        refused = pair.receiver.refusals.counts
        with _stranger(pair.receiver.endpoint) as stranger:
            garbage, unknown, _ = _hostile_frames(pair, relay)
            stranger.send_multipart(garbage)
            stranger.send_multipart(unknown)
            # Opening a flow from elsewhere would make the node link there (a socket
            # and a shared-memory slab per frame): refused.
            opening = wire.OpenFlow(99, "ipc:///tmp/elsewhere/n99", relay.path)
            stranger.send(msgspec.msgpack.encode(opening))
            # Spoofing node 2 cannot swap its slab nor add to its credits.
            stranger.send(msgspec.msgpack.encode(wire.SlabOffer(2, 2, "omni-actors-x")))
            await eventually(lambda: refused["flow from an unknown node elsewhere"])
        assert refused["malformed frame"] == 1
        assert refused["user message from a node with no link"] == 1
        assert refused["second slab offer"] == 1
        assert set(pair.receiver._links) == {2}
        await flow.push_user((Payload(1, torch.ones(2)), None))
        assert (await probe.expect_message(Payload)).seq == 1
        await probe.expect_no_message(0.1)


# -- 2. replayed frames -------------------------------------------------------------------


async def test_a_replayed_tell_or_ask_is_handled_once() -> None:
    async with _pair(None) as pair:
        probe = await pair.kit.create_probe()
        relay = await pair.kit.spawn(Relay, probe.ref)
        await pair.flow(relay)
        link = pair.sender.link(1)
        body = link.encoder.encode_into(Payload(1, torch.ones(2)), [])
        link.seq += 1
        tell = pair.forge(relay.path, body, link.seq)
        link.seq += 1
        ask = msgspec.msgpack.encode(wire.Ask(relay.path, 2, link.seq, 77, msgspec.Raw(body)))
        for frame in (tell, tell, ask, ask):
            link.socket.send(frame)
        await eventually(lambda: pair.receiver.refusals.counts["replayed user message"] == 2)
        await probe.expect_message(Payload)
        await probe.expect_message(Payload)
        await probe.expect_no_message(0.1)


async def test_a_replayed_reply_resolves_no_other_ask() -> None:
    async with _pair(None) as pair:
        back = pair.receiver.connect(2, pair.sender.endpoint)
        loop = asyncio.get_running_loop()
        first: asyncio.Future[Any] = loop.create_future()
        corr = pair.sender.new_ask(first, int, 1)
        reply = wire.AskReply(corr, msgspec.Raw(msgspec.msgpack.encode(1)))
        back.send(reply)
        assert await first == 1
        second: asyncio.Future[Any] = loop.create_future()
        pair.sender.new_ask(second, int, 1)
        back.send(reply)  # the first ask's reply, again
        back.send(wire.AskReply(-1, msgspec.Raw(msgspec.msgpack.encode(3))))
        # Frames on one link arrive in order: this one is handled after both.
        probe_done: asyncio.Future[Any] = loop.create_future()
        marker = pair.sender.new_ask(probe_done, int, 1)
        back.send(wire.AskReply(marker, msgspec.Raw(msgspec.msgpack.encode(9))))
        assert await probe_done == 9
        assert not second.done()
        second.cancel()


async def test_a_replayed_credit_grant_adds_no_credit() -> None:
    async with _pair(None) as pair:
        probe = await pair.kit.create_probe()
        relay = await pair.kit.spawn(Relay, probe.ref, props=Props(mailbox=MailboxConfig(4)))
        flow = await pair.flow(relay)
        assert flow.credits == 4  # the relay's room
        back = pair.receiver.link(2)
        for _ in range(3):
            back.send(wire.Credit(1, relay.path, 4))  # the opening grant, replayed
        refused = pair.sender.refusals.counts
        await eventually(lambda: refused["stale credit grant"] == 3)
        assert flow.credits == 4
        # Real grants still count: 4 handled messages come back as a limit of 8.
        for seq in range(4):
            await flow.push_user((Payload(seq, torch.ones(1)), None))
        for _ in range(4):
            await probe.expect_message(Payload)
        await eventually(lambda: flow.credits == 4, what="the four credits returned")


async def test_a_replayed_slab_placement_never_hands_a_slot_out_twice() -> None:
    async with _pair(None) as pair:
        probe = await pair.kit.create_probe()
        relay = await pair.kit.spawn(Relay, probe.ref)
        await pair.flow(relay)
        link = pair.sender.link(1)
        slab = link.slab
        assert slab is not None
        await eventually(lambda: pair.receiver.slabs.attached(2), what="the slab mapped")
        body = link.encoder.encode_into(Payload(1, torch.ones(1 << 19)), [])  # 2 MiB
        assert slab.busy() == 1

        def send_again() -> None:
            link.seq += 1  # a fresh number: the placement, not the frame, is replayed
            link.socket.send(pair.forge(relay.path, body, link.seq))

        send_again()
        held = await probe.expect_message(Payload)
        send_again()  # while the first tensor still holds the slot
        await eventually(lambda: pair.receiver.slabs.held(2) == 1 and slab.busy() == 1)
        await probe.expect_no_message(0.1)
        del held
        gc.collect()
        await eventually(lambda: slab.busy() == 0, what="the slot returned")
        send_again()  # after the slot went back: it holds no message now
        await probe.expect_no_message(0.1)
        assert slab.busy() == 0
        # The slot serves the next real message.
        fresh = link.encoder.encode_into(Payload(2, torch.ones(1 << 19)), [])
        link.seq += 1
        link.socket.send(pair.forge(relay.path, fresh, link.seq))
        assert (await probe.expect_message(Payload)).seq == 2


# -- 3. a peer that stops reading -----------------------------------------------------------


async def test_a_stopped_worker_bounds_the_sender_and_traffic_resumes() -> None:
    async with ActorTestKit(stop_timeout=2.0) as kit:
        ref = await kit.spawn(
            Echo, name="echo", props=Props(process=True, mailbox=MailboxConfig(capacity=4))
        )
        pid = await ref.ask(Pid(), timeout=10)
        placement = kit.system._placements["process"]
        assert isinstance(placement, ProcessPlacement)
        node = placement.workers.node
        await kit.eventually(lambda: kit.mailbox_room(ref) == 4)
        os.kill(pid, signal.SIGSTOP)
        try:
            for seq in range(4):
                await ref.tell(Payload(seq, torch.ones(2)), timeout=5)
            assert kit.mailbox_room(ref) == 0
            for _ in range(5):
                with pytest.raises(SendTimeoutError):
                    await ref.tell(Count(), timeout=0.05)
                with pytest.raises(AskTimeoutError):
                    await ref.ask(Count(), timeout=0.05)
            # Nothing waits on, nothing is owed: the sender holds no state per failure.
            assert kit.blocked_senders(ref) == 0
            assert not node._asks
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await ref.ask(Count(), timeout=10) == 6  # Pid, four payloads, this
        await kit.eventually(lambda: kit.mailbox_room(ref) == 4, what="credits returned")
        await ref.tell(Block(0), timeout=5)
        assert await ref.ask(Count(), timeout=10) == 8
