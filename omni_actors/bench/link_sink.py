"""The receiving actor of ``bench cuda``'s hop measurement, run in a worker process (the
worker imports it by module name)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import torch

from omni_actors import Actor
from omni_actors.cuda import DeviceInbound
from omni_actors.cuda.ipc import DeviceLinkImport, map_offer
from omni_actors.protocols.device import (
    DeviceLinkAnswer,
    DeviceLinkLost,
    DeviceLinkOffer,
    DeviceSlice,
    SlotsFree,
)

__all__ = ["HopSink", "HostHop", "LinkHop", "SlotReturns"]


class HostHop(msgspec.Struct, tag=True, frozen=True):
    """Tensors that came through host memory: copy them to the device."""

    tensors: dict[str, torch.Tensor]


class LinkHop(msgspec.Struct, tag=True, frozen=True):
    """Tensors in slots of the device link: copy them out."""

    slices: dict[str, DeviceSlice]


class SlotReturns(Actor[SlotsFree | DeviceLinkLost]):
    """The sender's end of a link: slots the receiver gave back are free again."""

    def __init__(self, release: Callable[[tuple[int, ...]], None]) -> None:
        self.release = release

    async def receive(self, message: SlotsFree | DeviceLinkLost) -> None:
        if isinstance(message, SlotsFree):
            self.release(message.slots)


class HopSink(Actor[DeviceLinkOffer | HostHop | LinkHop]):
    """Puts what it gets on its GPU, waits until it is there, then replies (a link's
    slots go back to the sender first, as a stage gives them back)."""

    replies = DeviceLinkAnswer | None

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.inbound = DeviceInbound(self.device, slots=4, slot_bytes=32 << 20)
        self.link: DeviceLinkImport | None = None

    async def receive(
        self, message: DeviceLinkOffer | HostHop | LinkHop
    ) -> DeviceLinkAnswer | None:
        match message:
            case DeviceLinkOffer():
                self.link, answer = map_offer(message, self.device)
                return answer
            case HostHop(tensors=tensors):
                self.inbound.load(tensors)
                torch.cuda.current_stream(self.device).synchronize()
                return None
            case LinkHop(slices=slices):
                if self.link is None:
                    raise RuntimeError("no device link was offered")
                _, done = self.link.take(slices)
                torch.cuda.current_stream(self.device).synchronize()
                done.synchronize()
                slots = tuple({s.slot for s in slices.values()})
                await self.link.offer.sender.tell(SlotsFree(link=self.link.offer.link, slots=slots))
                return None
        raise AssertionError(message)  # pragma: no cover - typed union

    async def on_stop(self) -> None:
        """Unmap the link (its pool is the sender's)."""
        self.inbound.synchronize()
        if self.link is not None:
            self.link.close()
