"""Actors that GPU tests run in worker processes (workers import them by module name)."""

from __future__ import annotations

import msgspec
import torch

from omni_actors import Actor
from omni_actors.cuda.ipc import DeviceLinkImport, covered_slots, map_offer
from omni_actors.protocols.device import DeviceLinkAnswer, DeviceLinkOffer, DeviceSlice


class Carry(msgspec.Struct, tag=True, frozen=True):
    """Take these slices out of the link."""

    slices: dict[str, DeviceSlice]


class Carried(msgspec.Struct, tag=True, frozen=True):
    """What the slices held (copied to the host here), and the slots to give back."""

    tensors: dict[str, torch.Tensor]
    slots: tuple[int, ...]


class LinkReceiver(Actor[DeviceLinkOffer | Carry]):
    """Maps the link offered to it and copies slices out on its own GPU."""

    replies = DeviceLinkAnswer | Carried

    def __init__(self, device: str = "cuda:0") -> None:
        self.device = torch.device(device)
        self.link: DeviceLinkImport | None = None

    async def receive(self, message: DeviceLinkOffer | Carry) -> DeviceLinkAnswer | Carried:
        match message:
            case DeviceLinkOffer():
                self.link, answer = map_offer(message, self.device)
                return answer
            case Carry(slices=slices):
                assert self.link is not None
                tensors, done = self.link.take(slices)
                host = {k: v.cpu() for k, v in tensors.items()}  # on the compute stream
                done.synchronize()
                offer = self.link.offer
                return Carried(host, covered_slots(slices.values(), offer.slot_bytes, offer.slots))
        raise AssertionError(message)

    async def on_stop(self) -> None:
        if self.link is not None:
            self.link.close()
