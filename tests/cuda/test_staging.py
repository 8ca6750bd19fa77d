"""Host staging without CUDA: the synchronous copy path with the slot bookkeeping the GPU
path uses — data exact for every dtype, slots lent once and returned when the last
tensor over them goes, bursts beyond the pool served by their own allocation."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from omni_actors.cuda import (
    DeviceInbound,
    HostStaging,
    SlotPool,
    StageTransfers,
    cuda_device,
    on_device,
)
from omni_actors.testing.tensors import SENDABLE_DTYPES, random_bits, same_bits

DTYPES = SENDABLE_DTYPES


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
async def test_staged_tensors_are_bit_exact_copies_in_slots(dtype: torch.dtype) -> None:
    staging = HostStaging("cpu", slots=2, slot_bytes=1 << 16)
    source = random_bits(dtype, (3, 5, 7), seed=1)
    out = await staging.to_host({"hidden": source, "text": "hi"})
    assert out["text"] == "hi"
    assert same_bits(out["hidden"], source)
    assert out["hidden"].data_ptr() != source.data_ptr()  # a copy, in a slot
    assert staging.pool.busy == 1
    del out
    gc.collect()
    assert staging.pool.busy == 0
    await staging.close()


async def test_a_slot_stays_lent_while_any_view_of_its_tensor_lives() -> None:
    staging = HostStaging("cpu", slots=1, slot_bytes=4096)
    out = await staging.to_host({"x": torch.arange(64, dtype=torch.int32)})
    row = out.pop("x")[10:20]  # the tensor goes, a view of it stays
    gc.collect()
    assert staging.pool.busy == 1
    # The pool has no free slot: the next transfer gets its own memory, not this slot.
    other = await staging.to_host({"x": torch.full((64,), -1, dtype=torch.int32)})
    assert staging.pool.overflows == 1
    assert row.tolist() == list(range(10, 20))
    del row
    gc.collect()
    assert staging.pool.busy == 0
    assert other["x"].eq(-1).all()
    await staging.close()


async def test_a_tensor_bigger_than_a_slot_is_copied_into_its_own_memory() -> None:
    staging = HostStaging("cpu", slots=2, slot_bytes=4096)
    big = torch.arange(4096, dtype=torch.float32)  # 16 KiB
    out = await staging.to_host({"big": big})
    assert torch.equal(out["big"], big)
    assert staging.pool.busy == 0
    assert staging.pool.overflows == 1
    await staging.close()


async def test_slots_are_reused_and_never_lent_twice() -> None:
    pool = SlotPool(3, 1024, pinned=False)
    held = [pool.take(100) for _ in range(3)]
    assert all(h is not None for h in held)
    addresses = {h.ctypes.data for h in held if h is not None}
    assert len(addresses) == 3
    assert pool.take(1) is None
    held.pop()
    gc.collect()
    again = pool.take(1024)
    assert again is not None
    assert again.ctypes.data in addresses
    assert pool.take(1025) is None
    assert pool.overflows == 2


def test_slots_come_back_from_other_threads() -> None:
    pool = SlotPool(4, 256, pinned=False)
    views = [pool.take(256) for _ in range(4)]
    assert pool.busy == 4

    def drop() -> None:
        views.clear()
        gc.collect()

    thread = threading.Thread(target=drop)
    thread.start()
    thread.join(timeout=10)
    assert pool.busy == 0


def test_zero_sized_tensors_take_no_slot() -> None:
    staging = HostStaging("cpu", slots=1, slot_bytes=4096)
    transfer = staging.begin({"empty": torch.empty(0, 5)})
    assert transfer.fields["empty"].shape == (0, 5)
    assert staging.pool.busy == 0
    assert staging.pool.overflows == 0


def test_inbound_on_the_cpu_hands_tensors_over_as_they_are() -> None:
    inbound = DeviceInbound("cpu")
    x = torch.ones(3)
    out = inbound.load({"x": x, "n": 3})
    assert out["x"] is x
    assert out["n"] == 3
    assert inbound.inflight == 0


@pytest.mark.parametrize("copies", ["async", "sync"])
def test_inputs_read_on_the_host_stay_there(copies: str) -> None:
    """A stage moves its inputs to its device (``meta`` stands for a GPU here) but those
    its engine reads on the host: reading them back would wait for the device's queue."""
    transfers = StageTransfers("meta", copies=copies)  # type: ignore[arg-type]
    edits = torch.tensor([3, -1])
    out = transfers.load({"rows": torch.ones(2, 4), "user_edits": edits}, host={"user_edits"})
    assert out["rows"].device.type == "meta"
    assert out["user_edits"] is edits
    assert transfers.load({"user_edits": edits})["user_edits"].device.type == "meta"


def test_on_device_sees_only_tensors_outside_host_memory() -> None:
    assert not on_device({"x": torch.ones(2), "t": "text"})
    assert on_device({"x": torch.ones(2, device="meta")})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error() -> None:
    assert cuda_device("cpu") is False
    with pytest.raises(RuntimeError, match="no CUDA"):
        HostStaging("cuda")
    with pytest.raises(RuntimeError, match="no CUDA"):
        DeviceInbound("cuda:0")
