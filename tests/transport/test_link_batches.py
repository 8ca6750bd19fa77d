"""Envelopes a link sends within one turn of the event loop: the first goes at once, the
rest leave together in one ``wire.Batch`` frame at the turn's end, in order; a frame
with out-of-band buffers goes after what was held. A receiver splits a batch and
handles each envelope as if it had come alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import torch
from node_pair import node_pair
from remote_actors import Payload, Relay

from omni_actors import MailboxConfig
from omni_actors.protocols import wire
from omni_actors.testing import ActorTestKit, TestProbe, eventually
from omni_actors.transport.link import Link
from omni_actors.transport.node import Node
from omni_actors.transport.remote import RemoteMailbox


class Counting:
    """A link's socket that counts the frames sent through it (each final part)."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.frames = 0

    def send(self, data: Any, flags: int = 0, **kwargs: Any) -> Any:
        if not flags:  # the last (or only) part of a frame
            self.frames += 1
        return self.socket.send(data, flags, **kwargs)

    def close(self, *args: Any, **kwargs: Any) -> None:
        self.socket.close(*args, **kwargs)


class Wired:
    def __init__(self, kit: ActorTestKit, receiver: Node, sender: Node) -> None:
        self.kit, self.receiver, self.sender = kit, receiver, sender

    async def relay(self, credits: int) -> tuple[TestProbe, RemoteMailbox, Link, Counting]:
        """A relay on the receiver, a flow to it from the sender, its link's counter."""
        probe = await self.kit.create_probe()
        relay = await self.kit.spawn(Relay, probe.ref)
        link = self.sender.connect(1, self.receiver.endpoint)
        self.receiver.connect(self.sender.node_id, self.sender.endpoint)
        mailbox = RemoteMailbox("/remote", MailboxConfig(capacity=credits), Payload)
        mailbox.bind(self.sender, link, relay.path, credits=credits)
        # One round trip first: the set-up's own envelopes (the slab's offer) are out.
        await mailbox.push_user((Payload(-1, torch.ones(1)), None))
        assert (await probe.expect_message(Payload)).seq == -1
        # The receiver's link offered its slab when it opened; the sender answers that
        # offer with a frame of its own, which must be out before frames are counted.
        receiver_id = self.receiver.node_id
        await eventually(
            lambda: self.sender.slabs.attached(receiver_id), what="the receiver's slab attached"
        )
        counting = Counting(link.socket)
        link.socket = counting  # type: ignore[assignment]
        return probe, mailbox, link, counting


@asynccontextmanager
async def _wired() -> AsyncIterator[Wired]:
    async with node_pair() as nodes:
        yield Wired(*nodes)


async def test_the_envelopes_of_one_turn_leave_in_two_frames_in_order() -> None:
    async with _wired() as wired:
        probe, mailbox, _, counting = await wired.relay(credits=64)

        for seq in range(50):  # one turn of the loop: nothing here awaits
            assert mailbox.try_push_user((Payload(seq, torch.full((2,), seq)), None))
        assert counting.frames == 1  # the first went at once, the rest are held

        for seq in range(50):
            received = await probe.expect_message(Payload)
            assert received.seq == seq
            assert torch.equal(received.data, torch.full((2,), seq))
        assert counting.frames == 2  # the other 49 in one batch
        assert wired.receiver.refusals.counts == {}


async def test_a_frame_with_buffers_goes_after_the_envelopes_held_before_it() -> None:
    async with _wired() as wired:
        probe, mailbox, _, counting = await wired.relay(credits=64)
        big = torch.arange(64 * 1024, dtype=torch.float32)  # out of band, not inline

        for seq in range(5):
            data = big + seq if seq == 3 else torch.full((2,), seq)
            assert mailbox.try_push_user((Payload(seq, data), None))
        # At once: the first, then the two held before the big one as a batch, then the
        # big one itself; the last is held, and goes alone.
        assert counting.frames == 3

        for seq in range(5):
            received = await probe.expect_message(Payload)
            assert received.seq == seq
            expected = big + seq if seq == 3 else torch.full((2,), seq)
            assert torch.equal(received.data, expected)
        assert counting.frames == 4


async def test_a_batch_is_handled_envelope_by_envelope() -> None:
    async with _wired() as wired:
        probe, mailbox, link, _ = await wired.relay(credits=64)
        refused = wired.receiver.refusals.counts
        relay_path = mailbox.target

        def tell(target: str, seq: int) -> msgspec.Raw:
            link.seq += 1  # numbered as the link numbers its own: not a replay
            body = link.encoder.encode_into(Payload(seq, torch.ones(1)), [])
            tell = wire.Tell(target, 2, link.seq, msgspec.Raw(body))
            return msgspec.Raw(msgspec.msgpack.encode(tell))

        def batch(*messages: Any) -> bytes:
            return msgspec.msgpack.encode(["batch", list(messages)])

        # One for an actor that is not there, between two that are: those two arrive.
        link.socket.send(batch(tell(relay_path, 1), tell("/nobody", 2), tell(relay_path, 3)))
        assert (await probe.expect_message(Payload)).seq == 1
        assert (await probe.expect_message(Payload)).seq == 3
        # A batch in a batch, or an envelope that is not one, makes the frame malformed:
        # refused whole, and the inbox goes on.
        link.socket.send(batch(msgspec.Raw(batch(tell(relay_path, 4)))))
        link.socket.send(batch(tell(relay_path, 5), ["tell", "short"]))
        link.socket.send(batch())
        await eventually(lambda: refused["malformed frame"] == 2)
        assert mailbox.try_push_user((Payload(6, torch.ones(1)), None))
        assert (await probe.expect_message(Payload)).seq == 6
        await probe.expect_no_message(0.05)
