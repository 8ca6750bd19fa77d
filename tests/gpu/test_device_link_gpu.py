"""Device links between two processes, on one GPU and (with two GPUs) across them: every
dtype arrives bit-exact through the slots, a message bigger than a slot through a run of
them, slots are reused under load without corrupting data, and an offer the driver
refuses leaves the link closed with its reason (the host path then serves)."""

from __future__ import annotations

import random

import msgspec
import pytest
import torch
from gpu_actors import Carried, Carry, LinkReceiver

from omni_actors import Props
from omni_actors.cuda.ipc import DeviceLink
from omni_actors.protocols.device import DeviceLinkAnswer
from omni_actors.testing import ActorTestKit
from omni_actors.testing.tensors import SENDABLE_DTYPES, random_bits, same_bits

DEVICE = torch.device("cuda", 0)
DTYPES = SENDABLE_DTYPES


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the peer path needs two GPUs")


@pytest.mark.parametrize(
    ("receiver_device", "peer"),
    [("cuda:0", False), pytest.param("cuda:1", True, marks=TWO_GPUS, id="peer")],
)
async def test_every_dtype_crosses_a_device_link_bit_exact(
    receiver_device: str, peer: bool
) -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        receiver = await kit.spawn(
            LinkReceiver, receiver_device, name="receiver", props=Props(process=True)
        )
        link = DeviceLink(DEVICE, slots=len(DTYPES) + 2, slot_bytes=2 << 20)
        try:
            answer = await receiver.ask(link.offer("talker", probe.ref), timeout=30)
            assert answer == DeviceLinkAnswer(accepted=True, peer=peer)
            sources = {
                str(dtype): random_bits(dtype, (123, 45), seed=i, device=DEVICE)
                for i, dtype in enumerate(DTYPES)
            }
            sources["empty"] = torch.empty(0, 7, device=DEVICE)
            sources["noncontiguous"] = random_bits(
                torch.float32, (64, 32), seed=99, device=DEVICE
            ).t()
            slices, rest = link.put({**sources, "text": "kept"})
            assert rest == {"text": "kept"}
            carried = await receiver.ask(Carry(slices), timeout=30)
            assert isinstance(carried, Carried)
            for name, source in sources.items():
                assert same_bits(carried.tensors[name], source.cpu()), name
            assert link.busy == 1  # one message, one slot
            assert len(carried.slots) == 1
            link.release(carried.slots)
            assert link.busy == 0
        finally:
            await kit.system.stop(receiver)
            link.close()


async def test_a_message_bigger_than_a_slot_takes_a_run_of_free_ones() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        receiver = await kit.spawn(LinkReceiver, name="receiver", props=Props(process=True))
        link = DeviceLink(DEVICE, slots=6, slot_bytes=1 << 20)
        try:
            assert (await receiver.ask(link.offer("talker", probe.ref), timeout=30)).accepted
            small = random_bits(torch.int32, (1024,), seed=1, device=DEVICE)
            rows = random_bits(torch.bfloat16, (1536, 1024), seed=2, device=DEVICE)  # 3 MiB
            first, _ = link.put({"small": small})
            second, _ = link.put({"rows": rows, "small": small})
            assert (first["small"].slot, second["rows"].slot) == (0, 1)
            assert link.busy == 5  # 3 MiB and 4 KiB: slots 1 to 4
            third, rest = link.put({"rows": rows})  # one slot left: the host path
            assert third == {}
            assert "rows" in rest
            assert link.fallbacks == 1
            carried = await receiver.ask(Carry(second), timeout=30)
            assert isinstance(carried, Carried)
            assert carried.slots == (1, 2, 3, 4)
            assert same_bits(carried.tensors["rows"], rows.cpu())
            assert same_bits(carried.tensors["small"], small.cpu())
            link.release(carried.slots)
            again, _ = link.put({"rows": rows})
            assert again["rows"].slot == 1
            carried = await receiver.ask(Carry(again), timeout=30)
            assert carried.slots == (1, 2, 3)
            assert same_bits(carried.tensors["rows"], rows.cpu())
        finally:
            await kit.system.stop(receiver)
            link.close()


async def test_slots_are_reused_under_load_without_corrupting_data() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        receiver = await kit.spawn(LinkReceiver, name="receiver", props=Props(process=True))
        link = DeviceLink(DEVICE, slots=4, slot_bytes=1 << 20)
        rng = random.Random(0)
        try:
            assert (await receiver.ask(link.offer("talker", probe.ref), timeout=30)).accepted
            pending: list[tuple[dict[str, object], int, int]] = []
            fallbacks = 0
            for step in range(300):
                value = torch.full((256, 256), step, dtype=torch.int32, device=DEVICE)
                value += torch.arange(256, dtype=torch.int32, device=DEVICE)
                slices, rest = link.put({"x": value})
                del value  # the caching allocator may reuse it at once: the copy must hold it
                if not slices:
                    fallbacks += 1
                    assert "x" in rest
                else:
                    pending.append((dict(slices), step, int(256 * (step * 256 + 255 * 128))))
                # Deliver in a shuffled order, sometimes several at once.
                while pending and (len(pending) > 2 or rng.random() < 0.5):
                    sent, at, checksum = pending.pop(rng.randrange(len(pending)))
                    carried = await receiver.ask(Carry(sent), timeout=30)  # type: ignore[arg-type]
                    assert int(carried.tensors["x"].sum()) == checksum, f"step {at} corrupted"
                    link.release(carried.slots)
            assert link.sent > 250
            assert fallbacks == link.fallbacks
        finally:
            await kit.system.stop(receiver)
            link.close()


async def test_a_refused_offer_names_its_reason() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        receiver = await kit.spawn(LinkReceiver, name="receiver", props=Props(process=True))
        link = DeviceLink(DEVICE, slots=1, slot_bytes=4096)
        try:
            offer = link.offer("talker", probe.ref)
            bogus = await receiver.ask(msgspec.structs.replace(offer, memory=bytes(64)), timeout=30)
            assert not bogus.accepted
            assert "cuIpcOpenMemHandle" in bogus.reason
            elsewhere = await receiver.ask(
                msgspec.structs.replace(offer, host="another-host/1"), timeout=30
            )
            assert not elsewhere.accepted
            assert "another host" in elsewhere.reason
        finally:
            await kit.system.stop(receiver)
            link.close()
