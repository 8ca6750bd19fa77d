"""Device links: one stage's tensors into another process's GPU without the host.

The sending side (:class:`DeviceLink`) owns a pool of device slots allocated once per
receiver, an IPC event, and a copy stream. Putting a message's device tensors copies
them, one after another, into a run of as many free slots as they need (one, usually)
on the copy stream (after the step that made them, see
:mod:`~omni_actors.cuda.step_ready`) and records the event; the chunk then names the
run's first slot and each tensor's offset from it. The receiving side
(:class:`DeviceLinkImport`) has mapped the pool once, on the pool's GPU; it makes its
own stream there wait on the event, copies the slots out into tensors of its own (a
peer copy when it computes on another GPU), and its compute stream waits for that copy.
The slots go back to the sender once the copy has completed (``SlotsFree``).

Nothing waits for a slot: a message whose tensors do not fit a run of free slots takes
the host path instead, so a slow or dead receiver costs speed, never a hang. The
receiver gives back every slot a message's bytes cover (:func:`covered_slots`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import secrets
import socket
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from omni_actors.cuda.driver import (
    DeviceBuffer,
    IpcUnavailableError,
    close_ipc,
    mapped_tensor,
    open_ipc,
)
from omni_actors.cuda.step_ready import step_mark, wait_ready
from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.device import (
    DeviceLinkAnswer,
    DeviceLinkLost,
    DeviceLinkOffer,
    DeviceSlice,
    SlotsFree,
)
from omni_actors.protocols.tensors import TORCH_DTYPES, TORCH_NAMES

__all__ = [
    "DeviceLink",
    "DeviceLinkImport",
    "SlotRuns",
    "covered_slots",
    "gpu_uuid",
    "host_identity",
    "map_offer",
]

log = logging.getLogger(__name__)

_ALIGN = 512  # slots and the tensors in them: aligned for any dtype and vector loads
_DTYPES = TORCH_DTYPES
_NAMES = TORCH_NAMES


@functools.cache
def host_identity() -> str:
    """This host, as IPC handles see it: its name and this boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def gpu_uuid(device: torch.device) -> str:
    """The GPU's UUID: the same physical GPU whatever index a process sees it under."""
    return str(torch.cuda.get_device_properties(device).uuid)


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.contiguous().view(-1)
    return flat if flat.dtype is torch.uint8 else flat.view(torch.uint8)


class SlotRuns:
    """Which of a link's ``slots`` slots are free, taken as runs of neighbours.

    A message takes the first run of free slots long enough for its bytes, so one too
    big for a slot (a prompt's rows, say) still crosses the link whole. Thread-safe, as
    the link is.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = [True] * slots
        self._lock = threading.Lock()

    @property
    def busy(self) -> int:
        """Slots taken and not given back."""
        with self._lock:
            return self._free.count(False)

    def take(self, count: int) -> int | None:
        """The first slot of ``count`` free neighbours, now taken; None if there is no
        such run."""
        with self._lock:
            free = self._free
            run = 0
            for slot in range(self.slots):
                run = run + 1 if free[slot] else 0
                if run == count:
                    start = slot - count + 1
                    free[start : slot + 1] = [False] * count
                    return start
        return None

    def release(self, slots: Iterable[int]) -> None:
        """Give ``slots`` back (numbers outside the pool are ignored)."""
        with self._lock:
            for slot in slots:
                if 0 <= slot < self.slots:
                    self._free[slot] = True


def covered_slots(slices: Iterable[DeviceSlice], slot_bytes: int, slots: int) -> tuple[int, ...]:
    """The slots of a pool of ``slots`` that ``slices`` occupy: each one's named slot and
    every slot its bytes reach into (a message of many slots names its first; its
    tensors' offsets go past it)."""
    covered: set[int] = set()
    for piece in slices:
        covered.add(piece.slot)
        dtype = _DTYPES.get(piece.dtype)
        numel = math.prod(piece.shape)
        if dtype is None or numel <= 0 or piece.offset < 0:
            continue
        start = piece.slot * slot_bytes + piece.offset
        end = start + numel * dtype.itemsize
        covered.update(range(start // slot_bytes, min(-(-end // slot_bytes), slots)))
    return tuple(sorted(covered))


class DeviceLink:
    """The sending side of a link: a pool of ``slots`` device slots of ``slot_bytes``.

    Args:
        device: the sending stage's GPU (the pool lives there).
        slots: slots in the pool.
        slot_bytes: the size of a slot.
    """

    def __init__(self, device: torch.device, *, slots: int, slot_bytes: int) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError("a device link needs at least one slot of at least one byte")
        self.device = device
        self.slots = slots
        self.slot_bytes = -(-slot_bytes // _ALIGN) * _ALIGN
        self.id = secrets.randbits(62)
        self.buffer = DeviceBuffer(device, self.slots * self.slot_bytes)
        self.event = torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()  # a put against close()
        self.runs = SlotRuns(self.slots)
        self.sent = 0
        self.fallbacks = 0
        # Puts whose copy waited on everything the caller had queued (a tensor without a
        # step mark): each may have waited for a step that made none of it.
        self.unmarked = 0
        self.closed = False

    def offer(
        self, source: str, sender: ActorAddress[SlotsFree | DeviceLinkLost]
    ) -> DeviceLinkOffer:
        """The offer that lets a receiver map this link."""
        return DeviceLinkOffer(
            link=self.id,
            source=source,
            sender=sender,
            host=host_identity(),
            gpu=gpu_uuid(self.device),
            memory=self.buffer.handle(),
            event=bytes(self.event.ipc_handle()),  # type: ignore[no-untyped-call]
            slots=self.slots,
            slot_bytes=self.slot_bytes,
        )

    @property
    def busy(self) -> int:
        """Slots the receiver still holds."""
        return self.runs.busy

    def put(self, fields: Mapping[str, Any]) -> tuple[dict[str, DeviceSlice], dict[str, Any]]:
        """Copy the device tensors of ``fields`` into a run of free slots, one after
        another (one slot if they fit it).

        Returns:
            The slices placed, and the fields left (host tensors, texts, and every device
            tensor if no run of free slots holds them: then nothing is placed, counted in
            :attr:`fallbacks`, and they take the host path).
        """
        placed = {
            k: v
            for k, v in fields.items()
            if isinstance(v, torch.Tensor) and v.device.type == "cuda" and v.dtype in _NAMES
        }
        rest = {k: v for k, v in fields.items() if k not in placed}
        if not placed:
            return {}, rest
        sizes = {k: v.numel() * v.element_size() for k, v in placed.items()}
        offsets, end, used = {}, 0, 0
        for name, size in sizes.items():
            offsets[name] = end
            used = end + size  # the padding after the last is not the receiver's to free
            end += -(-size // _ALIGN) * _ALIGN
        count = max(1, -(-used // self.slot_bytes))
        with self._lock:
            first = None if self.closed or count > self.slots else self.runs.take(count)
            if first is None:
                self.fallbacks += 1
                return {}, dict(fields)
        # After the step that made the tensors (their marks), else after all the caller
        # has queued on the device so far.
        if not wait_ready(self.stream, placed.values(), torch.cuda.current_stream(self.device)):
            self.unmarked += 1
            if self.unmarked == 1:
                unmarked = [k for k, v in placed.items() if step_mark(v) is None]
                # With the stack: where the unmarked tensors were sent from.
                log.warning(
                    "device link %x: %s carry no step mark: their copies wait for all "
                    "queued before them",
                    self.id,
                    unmarked,
                    stack_info=True,
                )
        slices: dict[str, DeviceSlice] = {}
        base = first * self.slot_bytes
        with torch.cuda.stream(self.stream):
            for name, tensor in placed.items():
                start = base + offsets[name]
                if sizes[name]:
                    self.buffer.tensor[start : start + sizes[name]].copy_(_bytes_of(tensor))
                tensor.record_stream(self.stream)
                dtype = _NAMES[tensor.dtype]
                slices[name] = DeviceSlice(
                    self.id, first, dtype, tuple(tensor.shape), offsets[name]
                )
            self.event.record(self.stream)
        self.sent += 1
        return slices, rest

    def release(self, slots: tuple[int, ...]) -> None:
        """The receiver is done with ``slots`` (invalid numbers are ignored)."""
        self.runs.release(slots)

    def close(self) -> None:
        """Free the pool once the copies into it are done. Receivers must have unmapped
        it or be gone (a receiver that still reads it reads freed memory)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self.stream.synchronize()
        self.buffer.free()


class DeviceLinkImport:
    """The receiving side of a link, for a stage that computes on ``device``.

    The pool is mapped into the context of the GPU it lives on (as this process numbers
    it), whichever GPU the stage computes on, and the link's event is opened there too:
    the mapping, the event and the stream that waits on it are then on one device, as
    in the process that made them. A stage on another GPU copies each slice from there
    into its own device (a peer copy), on a stream of its own on each side. (A stream of
    the stage's own GPU waiting on the event opened on the pool's GPU crashes the driver:
    SIGSEGV in ``cudaStreamWaitEvent``, on two H100s with driver 580 and CUDA 13.)

    Raises:
        IpcUnavailableError: the offer comes from another host, names a GPU this
            process does not see, or the driver refuses to map it (the caller answers
            the offer with the reason).
    """

    def __init__(self, offer: DeviceLinkOffer, device: torch.device) -> None:
        if offer.host != host_identity():
            raise IpcUnavailableError(f"the pool is on another host ({offer.host})")
        if offer.slots < 1 or offer.slot_bytes < 1:
            raise IpcUnavailableError("the offer has no slots")
        self.offer = offer
        self.device = _indexed(device)
        self.source_device = _device_of(offer.gpu)
        self.peer = self.source_device != self.device
        self.pointer = open_ipc(self.source_device, offer.memory)
        try:
            size = offer.slots * offer.slot_bytes
            self.memory = mapped_tensor(self.source_device, self.pointer, size, self)
            try:
                self.event = torch.cuda.Event.from_ipc_handle(  # type: ignore[no-untyped-call]
                    self.source_device, offer.event
                )
            except RuntimeError as exc:
                del self.memory
                raise IpcUnavailableError(f"cannot open the link's event: {exc}") from None
        except IpcUnavailableError:
            close_ipc(self.source_device, self.pointer)
            raise
        finally:
            torch.cuda.set_device(self.device)  # the driver calls made the pool's GPU current
        # Waits on the sender's event and reads the slots: the copies' source side.
        self.stream = torch.cuda.Stream(self.source_device)  # type: ignore[no-untyped-call]
        # Takes the copies in: the stage's compute stream waits on it.
        self.into = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.peer
            else self.stream
        )
        self.closed = False

    def take(self, slices: Mapping[str, DeviceSlice]) -> tuple[dict[str, torch.Tensor], Any]:
        """Tensors of this stage's own, copied out of ``slices``; the current stream waits
        for the copies on the device. Returns them and the event after which the slots
        may be given back.

        Raises:
            ValueError: a slice names another link, a slot or size outside the pool, or
                an unknown dtype (the chunk is rejected; its slots are still freed).
        """
        offer = self.offer
        out: dict[str, torch.Tensor] = {}
        plan = []
        for name, piece in slices.items():
            dtype = _DTYPES.get(piece.dtype)
            if piece.link != offer.link or dtype is None or not 0 <= piece.slot < offer.slots:
                raise ValueError(f"slice {name} does not fit link {offer.link}: {piece}")
            if any(d < 0 for d in piece.shape):
                raise ValueError(f"slice {name} has a negative dimension: {piece.shape}")
            numel = 1
            for d in piece.shape:
                numel *= d
            nbytes = numel * dtype.itemsize
            start = piece.slot * offer.slot_bytes + piece.offset
            if piece.offset < 0 or start + nbytes > offer.slots * offer.slot_bytes:
                raise ValueError(
                    f"slice {name} of {nbytes} bytes at {piece.offset} past slot {piece.slot} "
                    "exceeds the pool"
                )
            plan.append((name, piece, dtype, nbytes))
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_event(self.event)
        # Both devices' current streams are the link's own, so a peer copy (which torch
        # runs on the source's current stream, fenced against the destination's) waits
        # for neither side's compute; on one GPU both are the same stream.
        with torch.cuda.stream(self.into), torch.cuda.stream(self.stream):
            for name, piece, dtype, nbytes in plan:
                tensor = torch.empty(piece.shape, dtype=dtype, device=self.device)
                if nbytes:
                    start = piece.slot * offer.slot_bytes + piece.offset
                    _bytes_of(tensor).copy_(self.memory[start : start + nbytes], non_blocking=True)
                tensor.record_stream(compute)
                out[name] = tensor
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.into)
        compute.wait_event(done)
        return out, done

    def close(self) -> None:
        """Unmap the pool once the copies out of it are done."""
        if not self.closed:
            self.closed = True
            self.stream.synchronize()
            self.into.synchronize()
            del self.memory
            close_ipc(self.source_device, self.pointer)
            torch.cuda.set_device(self.device)


def map_offer(
    offer: DeviceLinkOffer, device: torch.device
) -> tuple[DeviceLinkImport | None, DeviceLinkAnswer]:
    """Map ``offer`` into ``device``'s context: the mapping (None if refused) and the
    answer to send back, which says why when it is refused."""
    try:
        imported = DeviceLinkImport(offer, device)
    except IpcUnavailableError as exc:
        return None, DeviceLinkAnswer(accepted=False, reason=str(exc))
    return imported, DeviceLinkAnswer(accepted=True, peer=imported.peer)


def _indexed(device: torch.device) -> torch.device:
    """``device`` with its index (``cuda`` is the current GPU)."""
    if device.index is None:
        return torch.device(device.type, torch.cuda.current_device())
    return device


def _device_of(uuid: str) -> torch.device:
    """This process's index of the GPU with ``uuid``.

    Raises:
        IpcUnavailableError: this process does not see that GPU.
    """
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        if gpu_uuid(device) == uuid:
            return device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    raise IpcUnavailableError(f"GPU {uuid} is not visible here (CUDA_VISIBLE_DEVICES={visible})")
