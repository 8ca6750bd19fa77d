"""A stage's device links where no CUDA IPC can happen (CI): offers are refused with
their reason, a chunk naming an unknown link fails its session and tells the sender,
slots of a chunk nobody will read go back, and a link that cannot be made leaves the
edge on the host path."""

from __future__ import annotations

import logging

import pytest
import torch

from omni_actors._task_scope import TaskScope
from omni_actors.actors.stage.actor import StageActor
from omni_actors.actors.stage.device_links import DeviceLinkLostError, DeviceLinks
from omni_actors.cuda import EventWaiter
from omni_actors.protocols.control import LinkCounts
from omni_actors.protocols.device import (
    DeviceChunk,
    DeviceLinkAnswer,
    DeviceLinkLost,
    DeviceLinkOffer,
    DeviceSlice,
    SlotsFree,
)
from omni_actors.protocols.stage import Chunk, SessionKey
from omni_actors.testing import ActorTestKit


def links(me: object) -> tuple[DeviceLinks, TaskScope]:
    tasks = TaskScope("test")
    made = DeviceLinks(
        "code2wav",
        torch.device("cuda", 0),
        me,
        tasks,
        EventWaiter(),
        slots=2,
        slot_bytes=4096,  # type: ignore[arg-type]
    )
    return made, tasks


def chunk(device: DeviceChunk) -> Chunk:
    return Chunk(key=SessionKey("s#1"), source="talker", seq=0, device=device)


async def test_a_chunk_on_an_unknown_link_fails_and_tells_the_sender() -> None:
    async with ActorTestKit() as kit:
        sender = await kit.create_probe()
        made, tasks = links(sender.ref)
        piece = DeviceSlice(5, 0, "float32", (4,))
        with pytest.raises(DeviceLinkLostError, match="no device link 5"):
            made.take(
                chunk(DeviceChunk(5, sender.ref, {"codes": piece})),
                DeviceChunk(5, sender.ref, {"codes": piece}),
            )
        lost = await sender.expect_message(DeviceLinkLost)
        assert lost.link == 5
        assert "restarted" in lost.reason
        await tasks.cancel(1.0, "test over")


async def test_slots_of_a_dropped_chunk_go_back() -> None:
    async with ActorTestKit() as kit:
        sender = await kit.create_probe()
        made, tasks = links(sender.ref)
        pieces = {"a": DeviceSlice(9, 0, "int64", (2,)), "b": DeviceSlice(9, 1, "bool", ())}
        made.drop(DeviceChunk(9, sender.ref, pieces))
        free = await sender.expect_message(SlotsFree)
        assert (free.link, sorted(free.slots)) == (9, [0, 1])
        await tasks.cancel(1.0, "test over")


async def test_without_cuda_a_new_edge_stays_on_the_host(caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    async with ActorTestKit() as kit:
        me = await kit.create_probe()
        receiver = await kit.create_probe()
        made, tasks = links(me.ref)
        with caplog.at_level(logging.WARNING):
            out = made.outgoing("talker", receiver.ref)
            assert made.outgoing("talker", receiver.ref) is out  # one link per receiver
            await kit.eventually(lambda: "no device link" in caplog.text)
        assert out.link is None
        assert made.counts() == LinkCounts(placed=0, host=0, unmarked=0)
        codes = torch.zeros(2)
        assert out.put({"codes": codes}) == (None, {"codes": codes})
        assert made.counts() == LinkCounts(placed=0, host=1, unmarked=0)  # no link up
        made.lost(DeviceLinkLost(link=123))  # an unknown link: nothing to close
        made.close()
        await tasks.cancel(1.0, "test over")


async def test_a_cpu_stage_refuses_an_offer_with_its_reason() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        stage = await kit.spawn(StageActor, "code2wav", "scripted", {}, name="code2wav")
        offer = DeviceLinkOffer(
            link=1, source="talker", sender=probe.ref, host="h/1", gpu="GPU-x",
            memory=bytes(64), event=bytes(64), slots=1, slot_bytes=4096,
        )  # fmt: skip
        answer = await stage.ask(offer, timeout=5)
        assert answer == DeviceLinkAnswer(
            accepted=False, reason="stage code2wav does not compute on a GPU"
        )


class _SentLink:
    """What ``DeviceLinks.counts`` reads of a ``DeviceLink`` (which needs CUDA IPC)."""

    def __init__(self, link: int, sent: int, fallbacks: int, unmarked: int) -> None:
        self.id, self.sent, self.fallbacks, self.unmarked = link, sent, fallbacks, unmarked
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def test_the_counts_sum_every_link_a_lost_one_included() -> None:
    async with ActorTestKit() as kit:
        me, receiver = await kit.create_probe(), await kit.create_probe()
        made, tasks = links(me.ref)
        assert made.counts() is None  # it never sent on a linked edge
        out = made.outgoing("code2wav", receiver.ref)
        first = _SentLink(7, sent=10, fallbacks=2, unmarked=1)
        made._by_id[7] = first  # type: ignore[assignment]
        out.link = first  # type: ignore[assignment]
        out.unlinked = 3  # sent before the receiver accepted
        assert made.counts() == LinkCounts(placed=10, host=5, unmarked=1)

        made.lost(DeviceLinkLost(link=7, reason="receiver restarted"))
        assert first.closed
        again = made.outgoing("code2wav", receiver.ref)  # a new link is offered
        assert again is not out
        second = _SentLink(8, sent=4, fallbacks=0, unmarked=0)
        made._by_id[8] = second  # type: ignore[assignment]
        again.link = second  # type: ignore[assignment]
        assert made.counts() == LinkCounts(placed=14, host=5, unmarked=1)  # since it started
        made.close()
        await tasks.cancel(1.0, "test over")
