"""Messages of device links: tensors between two stages' GPUs without the host.

A stage whose outputs go to a stage in another process on the same host, both on GPUs,
may keep them on the device: it allocates a pool of device slots for that receiver
once, and offers it (:class:`DeviceLinkOffer`: the pool's CUDA IPC handle and an IPC
event handle, as plain bytes). The receiver maps the pool and says whether it could
(:class:`DeviceLinkAnswer`); from then on a chunk names the slots its device tensors
were copied into (``Chunk.device``, :class:`DeviceSlice`), or a step of many sessions
the one slot its packed fields were copied into (``StepChunks.device``); the receiver
waits on the event on its own stream, copies them out, and gives the slots back
(:class:`SlotsFree`). When anything fails the link is closed and tensors take the host.
"""

from __future__ import annotations

import msgspec

from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.message import ControlMessage, Request

__all__ = [
    "DeviceChunk",
    "DeviceLinkAnswer",
    "DeviceLinkLost",
    "DeviceLinkOffer",
    "DeviceSlice",
    "SlotsFree",
]


class DeviceSlice(msgspec.Struct, frozen=True, array_like=True):
    """A tensor in a slot of a device link, ``offset`` bytes into the slot (a message's
    tensors share one slot).

    Attributes:
        link: the link's id (see :class:`DeviceLinkOffer`).
        slot: the slot.
        dtype: the tensor's dtype name (``float32``, ``bfloat16``, ...).
        shape: its shape (the bytes are contiguous, in row-major order).
        offset: where its bytes start in the slot.
    """

    link: int
    slot: int
    dtype: str
    shape: tuple[int, ...]
    offset: int = 0


class SlotsFree(msgspec.Struct, ControlMessage, tag="slots-free", frozen=True, kw_only=True):
    """Receiver → sending stage: the receiver has copied these slots out; reuse them."""

    link: int
    slots: tuple[int, ...]


class DeviceLinkLost(
    msgspec.Struct, ControlMessage, tag="device-link-lost", frozen=True, kw_only=True
):
    """Receiver → sending stage: a chunk named a link the receiver has not mapped (it
    restarted since the offer, say); the sender closes the link and offers a new one."""

    link: int
    reason: str = ""


class DeviceChunk(msgspec.Struct, frozen=True, array_like=True):
    """The device part of a chunk: tensors in slots of link ``link`` of ``sender``.

    Attributes:
        link: the link's id.
        sender: the sending stage, which gets the slots back (or hears the link is lost).
        slices: the tensors, by field name.
    """

    link: int
    sender: ActorAddress[SlotsFree | DeviceLinkLost]
    slices: dict[str, DeviceSlice]


class DeviceLinkAnswer(msgspec.Struct, tag="device-link-answer", frozen=True, kw_only=True):
    """Whether the receiver mapped the link; ``reason`` says why not."""

    accepted: bool
    reason: str = ""
    peer: bool = False
    """The receiver computes on another GPU than the pool's (copies are peer copies)."""


class DeviceLinkOffer(
    msgspec.Struct, Request[DeviceLinkAnswer], tag="device-link-offer", frozen=True, kw_only=True
):
    """Sending stage → receiving stage: map this pool of device slots.

    Attributes:
        link: an id for the link, unique on the host (chunks name it).
        source: the sending stage's name (a newer offer from it replaces the older).
        sender: where :class:`SlotsFree` goes.
        host: the sender's host identity (IPC handles mean nothing on another host).
        gpu: the UUID of the GPU the pool lives on.
        memory: the pool's CUDA IPC memory handle.
        event: an IPC event recorded after every copy into the pool.
        slots: slots in the pool.
        slot_bytes: the size of a slot.
    """

    link: int
    source: str
    sender: ActorAddress[SlotsFree | DeviceLinkLost]
    host: str
    gpu: str
    memory: bytes
    event: bytes
    slots: int
    slot_bytes: int
