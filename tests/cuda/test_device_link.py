"""Device links where CUDA IPC cannot work: each refusal is a typed error with its
reason, raised before anything is allocated or mapped, and a malformed slice is
rejected before any copy. A message too big for one slot takes a run of free
neighbours, and the receiver gives back every slot its bytes cover."""

from __future__ import annotations

import pytest
import torch

from omni_actors.cuda.driver import IpcUnavailableError, open_ipc
from omni_actors.cuda.ipc import (
    DeviceLink,
    DeviceLinkImport,
    SlotRuns,
    covered_slots,
    host_identity,
)
from omni_actors.protocols.device import DeviceLinkOffer, DeviceSlice
from omni_actors.testing import ActorTestKit


async def offer(**changes: object) -> DeviceLinkOffer:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        fields: dict[str, object] = {
            "link": 7,
            "source": "talker",
            "sender": probe.ref,
            "host": host_identity(),
            "gpu": "GPU-0",
            "memory": bytes(64),
            "event": bytes(64),
            "slots": 2,
            "slot_bytes": 4096,
        }
        return DeviceLinkOffer(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_host_identity_is_stable_and_names_this_boot() -> None:
    assert host_identity() == host_identity()
    assert "/" in host_identity()


async def test_an_offer_from_another_host_is_refused_before_mapping() -> None:
    with pytest.raises(IpcUnavailableError, match="another host"):
        DeviceLinkImport(await offer(host="elsewhere/1"), torch.device("cuda", 0))


async def test_an_offer_without_slots_is_refused() -> None:
    with pytest.raises(IpcUnavailableError, match="no slots"):
        DeviceLinkImport(await offer(slots=0), torch.device("cuda", 0))


async def test_an_offer_of_a_gpu_this_process_does_not_see_is_refused_before_mapping() -> None:
    # The pool is mapped on its own GPU, so the receiver must see it (as the sender's
    # CUDA_VISIBLE_DEVICES may hide it), whichever GPU the receiver computes on.
    with pytest.raises(IpcUnavailableError, match="GPU-no-such-gpu is not visible here"):
        DeviceLinkImport(await offer(gpu="GPU-no-such-gpu"), torch.device("cuda", 0))


def test_a_handle_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(IpcUnavailableError, match="64 bytes"):
        open_ipc(torch.device("cuda", 0), b"short")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_a_link_cannot_be_made() -> None:
    with pytest.raises(IpcUnavailableError, match="CUDA is not available"):
        DeviceLink(torch.device("cuda", 0), slots=2, slot_bytes=4096)
    with pytest.raises(ValueError, match="at least one slot"):
        DeviceLink(torch.device("cuda", 0), slots=0, slot_bytes=4096)


@pytest.mark.parametrize(
    "piece",
    [
        DeviceSlice(8, 0, "float32", (4,)),  # another link
        DeviceSlice(7, 2, "float32", (4,)),  # no such slot
        DeviceSlice(7, 0, "float8", (4,)),  # unknown dtype
        DeviceSlice(7, 0, "float32", (-1,)),  # negative dimension
        DeviceSlice(7, 0, "float32", (2049,)),  # bigger than the pool
        DeviceSlice(7, 1, "float32", (1025,)),  # from the last slot past the pool's end
        DeviceSlice(7, 1, "float32", (4,), 4090),  # past the pool's end
        DeviceSlice(7, 1, "float32", (4,), -8),  # before the slot's start
    ],
)
async def test_a_malformed_slice_is_rejected_before_any_copy(piece: DeviceSlice) -> None:
    receiving = DeviceLinkImport.__new__(DeviceLinkImport)  # no mapping: nothing may copy
    receiving.offer = await offer()
    with pytest.raises(ValueError, match="slice x"):
        receiving.take({"x": piece})


async def test_a_slice_may_run_from_its_slot_into_the_next() -> None:
    receiving = DeviceLinkImport.__new__(DeviceLinkImport)
    receiving.offer = await offer()
    whole = DeviceSlice(7, 0, "float32", (2048,))  # both slots of the pool
    beyond = DeviceSlice(7, 0, "float32", (4,), 4096)  # the second, named from the first
    # Validation passes (the copy then fails: this receiver mapped nothing).
    with pytest.raises(AttributeError):
        receiving.take({"x": whole, "y": beyond})


def test_a_run_takes_the_first_free_neighbours_and_slots_come_back() -> None:
    runs = SlotRuns(6)
    assert runs.take(1) == 0
    assert runs.take(3) == 1
    assert runs.take(3) is None  # two left, not three
    assert runs.take(2) == 4
    assert runs.busy == 6
    runs.release((1, 3, 99, -1))  # slots outside the pool are ignored
    assert runs.take(2) is None  # 1 and 3 are free, not neighbours
    runs.release((2,))
    assert runs.take(3) == 1
    assert runs.busy == 6
    runs.release(range(6))
    assert runs.take(7) is None
    assert runs.take(6) == 0


def test_the_slots_a_message_covers_are_those_its_bytes_reach() -> None:
    one = DeviceSlice(7, 2, "bfloat16", (8,), 0)  # 16 bytes in slot 2
    assert covered_slots([one], 4096, 8) == (2,)
    # Two tensors from slot 3: 4096 + 512 bytes, then 4000 more: into slot 5.
    first = DeviceSlice(7, 3, "bfloat16", (2304,), 0)
    second = DeviceSlice(7, 3, "uint8", (4000,), 4608)
    assert covered_slots([first, second], 4096, 8) == (3, 4, 5)
    # A message that ends on a slot's last byte does not cover the next one.
    exact = DeviceSlice(7, 0, "float32", (2048,), 0)
    assert covered_slots([exact], 4096, 8) == (0, 1)
    empty = DeviceSlice(7, 6, "float32", (0,), 0)  # no bytes: still its slot
    assert covered_slots([empty], 4096, 8) == (6,)
    # A malformed slice reaches no further than the pool.
    wild = DeviceSlice(7, 1, "float32", (1 << 40,), 0)
    assert covered_slots([wild], 4096, 8) == tuple(range(1, 8))
