"""Device links where CUDA IPC cannot work: each refusal is a typed error with its
reason, raised before anything is allocated or mapped, and a malformed slice is
rejected before any copy."""

from __future__ import annotations

import pytest
import torch

from omni_actors.cuda.driver import IpcUnavailableError, open_ipc
from omni_actors.cuda.ipc import DeviceLink, DeviceLinkImport, host_identity
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
        DeviceSlice(7, 0, "float32", (2048,)),  # bigger than a slot
        DeviceSlice(7, 1, "float32", (4,), 4090),  # past the slot's end
        DeviceSlice(7, 1, "float32", (4,), -8),  # before the slot's start
    ],
)
async def test_a_malformed_slice_is_rejected_before_any_copy(piece: DeviceSlice) -> None:
    receiving = DeviceLinkImport.__new__(DeviceLinkImport)  # no mapping: nothing may copy
    receiving.offer = await offer()
    with pytest.raises(ValueError, match="slice x"):
        receiving.take({"x": piece})
