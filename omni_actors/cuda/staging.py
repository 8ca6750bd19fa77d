"""Moving a stage's tensors between its device and host memory without stalling it.

Out (:class:`HostStaging`): the tensors a GPU stage produced are copied into host slots
on a copy stream of the stage's own, which first waits for the step that made them
(its mark, :mod:`~omni_actors.cuda.step_ready`; else the compute stream); the caller
awaits the copy's completion event through an :class:`~omni_actors.cuda.EventWaiter`,
so neither the next forward step nor the event loop waits for the copy.

In (:class:`DeviceInbound`): host tensors that reach a GPU stage are copied to the
device on the stage's own transfer stream, from page-locked memory (a host-to-device
copy from pageable memory would hold up the calling thread); the compute stream waits
on the copy's event, so the host never synchronizes.

Without CUDA both run synchronously with the same slot bookkeeping, which is how CI
tests them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

import torch

from omni_actors.cuda.event_waiter import EventWaiter
from omni_actors.cuda.slots import SlotPool, host_tensor
from omni_actors.cuda.step_ready import cat_ready, wait_ready

__all__ = [
    "DeviceInbound",
    "HostStaging",
    "StageTransfers",
    "Transfer",
    "cuda_device",
    "on_device",
]


def cuda_device(device: torch.device | str) -> bool:
    """Whether ``device`` is a CUDA device that this process can use.

    Raises:
        RuntimeError: ``device`` is CUDA and there is none here.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return False
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {device} was asked for, but this machine has no CUDA")
    return True


def on_device(fields: Mapping[str, Any]) -> bool:
    """Whether any tensor in ``fields`` lives outside host memory."""
    return any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in fields.values())


def _stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def _event() -> torch.cuda.Event:
    return torch.cuda.Event()  # type: ignore[no-untyped-call]


class Transfer:
    """Device-to-host copies started by :meth:`HostStaging.begin`.

    Attributes:
        fields: the fields with every device tensor replaced by its host copy; read the
            host tensors only once :meth:`wait` has returned.
    """

    def __init__(self, fields: dict[str, Any], done: torch.cuda.Event | None) -> None:
        self.fields = fields
        self._done = done

    async def wait(self, waiter: EventWaiter) -> dict[str, Any]:
        """The fields, once the copies have completed (at once if there were none)."""
        if self._done is not None:
            await waiter.wait(self._done)
            self._done = None
        return self.fields


class HostStaging:
    """A stage's device-to-host copies: slots, a copy stream and a completion waiter.

    Args:
        device: the device the stage computes on (``cpu`` copies synchronously).
        slots: host slots allocated at start.
        slot_bytes: the size of a slot; a bigger tensor gets its own allocation.
    """

    def __init__(
        self, device: torch.device | str, *, slots: int = 8, slot_bytes: int = 2 << 20
    ) -> None:
        self.device = torch.device(device)
        self.cuda = cuda_device(self.device)
        self.pool = SlotPool(slots, slot_bytes, pinned=self.cuda)
        self._stream = _stream(self.device) if self.cuda else None
        self.waiter = EventWaiter(f"omni-actors d2h {self.device}")

    def begin(self, fields: Mapping[str, Any], stream: torch.cuda.Stream | None = None) -> Transfer:
        """Start copying every tensor of ``fields`` to host slots (others pass through).

        The copies wait for the step that made the tensors when each carries its mark
        (:mod:`~omni_actors.cuda.step_ready`); otherwise call it on the thread that
        queued the work producing them, or later: they wait for everything queued so
        far on ``stream`` (default: the device's current stream). Without CUDA the
        copies are done on return.
        """
        copy_stream = self._stream
        if copy_stream is None:
            return Transfer({k: _copied(self.pool, v) for k, v in fields.items()}, None)
        produced = [v for v in fields.values() if isinstance(v, torch.Tensor) and v.is_cuda]
        after = stream if stream is not None else torch.cuda.current_stream(self.device)
        wait_ready(copy_stream, produced, after)
        out: dict[str, Any] = {}
        with torch.cuda.stream(copy_stream):
            for name, value in fields.items():
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    host = host_tensor(self.pool, value)
                    host.copy_(value, non_blocking=True)
                    # The allocator must not hand the source to the next step before
                    # this copy has read it.
                    value.record_stream(copy_stream)
                    value = host
                out[name] = value
            done = _event()
            done.record(copy_stream)
        return Transfer(out, done)

    def concat(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """``parts`` concatenated along dim 0 (a step's rows of many sessions, packed).

        Device tensors are concatenated on the copy stream once the steps that made them
        are done (their marks; else everything queued so far on the device's current
        stream), and the result carries a mark of its own
        (:func:`~omni_actors.cuda.step_ready.cat_ready`): a copy of it, to the host or
        into a device link's slot, waits for that and for nothing queued after it.
        """
        copy_stream = self._stream
        if copy_stream is None or not parts[0].is_cuda:
            return torch.cat(list(parts))
        return cat_ready(parts, copy_stream, torch.cuda.current_stream(parts[0].device))

    async def to_host(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`begin` then :meth:`Transfer.wait`: ``fields`` with host tensors."""
        return await self.begin(fields).wait(self.waiter)

    async def close(self) -> None:
        """Stop the waiter thread (pending waits fail); the slots go with the pool."""
        await self.waiter.close()


def _copied(pool: SlotPool, value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    host = host_tensor(pool, value)
    host.copy_(value)
    return host


class DeviceInbound:
    """A stage's host-to-device copies, on a transfer stream of its own.

    Args:
        device: the device the stage computes on (``cpu``: tensors are moved with
            ``.to``, synchronously).
        slots: page-locked slots that pageable inputs are first copied into.
        slot_bytes: the size of a slot.
    """

    def __init__(
        self, device: torch.device | str, *, slots: int = 8, slot_bytes: int = 2 << 20
    ) -> None:
        self.device = torch.device(device)
        self.cuda = cuda_device(self.device)
        self.pool = SlotPool(slots, slot_bytes, pinned=True) if self.cuda else None
        self._stream = _stream(self.device) if self.cuda else None
        # Host sources of copies that may still be running: they must outlive them.
        self._inflight: deque[tuple[torch.cuda.Event, list[torch.Tensor]]] = deque()

    @property
    def inflight(self) -> int:
        """Copies whose host sources are still held (completed ones are let go lazily)."""
        self._prune()
        return len(self._inflight)

    def load(self, fields: Mapping[str, Any], host: Collection[str] = ()) -> dict[str, Any]:
        """``fields`` with every tensor on this stage's device, but those named in
        ``host`` (read on the host: left where they are).

        Call it on the thread that then computes with them: its current stream waits on
        the copies (on the GPU, not on the host).
        """
        copy_stream = self._stream
        if copy_stream is None or self.pool is None:
            return {
                k: v.to(self.device) if isinstance(v, torch.Tensor) and k not in host else v
                for k, v in fields.items()
            }
        self._prune()
        out: dict[str, Any] = {}
        sources: list[torch.Tensor] = []
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(copy_stream):
            for name, value in fields.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.device != self.device
                    and name not in host
                ):
                    if value.device.type == "cpu" and not value.is_pinned():
                        staged = host_tensor(self.pool, value)
                        staged.copy_(value)
                        value = staged
                    elif value.device.type == "cuda":  # a peer copy: after its producer
                        producer = torch.cuda.current_stream(value.device)
                        wait_ready(copy_stream, (value,), producer)
                    sources.append(value)
                    value = value.to(self.device, non_blocking=True)
                    value.record_stream(compute)
                out[name] = value
            done = _event()
            done.record(copy_stream)
        compute.wait_event(done)
        if sources:
            self._inflight.append((done, sources))
        return out

    def _prune(self) -> None:
        inflight = self._inflight
        while inflight and inflight[0][0].query():  # type: ignore[no-untyped-call]
            inflight.popleft()

    def synchronize(self) -> None:
        """Wait until every copy has completed and let their sources go."""
        while self._inflight:
            event, _ = self._inflight.popleft()
            event.synchronize()


class StageTransfers:
    """A GPU stage's two directions: :class:`DeviceInbound` and :class:`HostStaging`,
    each with ``slots`` slots of ``slot_bytes``.

    ``copies="sync"`` is the baseline they replace, kept to measure against: outputs
    leave through ``.cpu()`` (the compute stream waits) and inputs arrive through
    ``.to(device)`` from wherever they landed.
    """

    def __init__(
        self,
        device: torch.device | str,
        *,
        slots: int = 8,
        slot_bytes: int = 2 << 20,
        copies: Literal["async", "sync"] = "async",
    ) -> None:
        self.copies = copies
        self.inbound = DeviceInbound(device, slots=slots, slot_bytes=slot_bytes)
        self.outbound = HostStaging(device, slots=slots, slot_bytes=slot_bytes)

    def load(self, fields: Mapping[str, Any], host: Collection[str] = ()) -> dict[str, Any]:
        """``fields`` with their tensors on the stage's device, but those named in ``host``
        (see :class:`DeviceInbound`)."""
        if self.copies == "sync":
            device = self.inbound.device
            return {
                k: v.to(device) if isinstance(v, torch.Tensor) and k not in host else v
                for k, v in fields.items()
            }
        return self.inbound.load(fields, host)

    def concat(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """``parts`` concatenated along dim 0, marked ready (see :meth:`HostStaging.concat`)."""
        if self.copies == "sync":
            return torch.cat(list(parts))
        return self.outbound.concat(parts)

    async def to_host(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """``fields`` with their tensors in host memory (see :class:`HostStaging`)."""
        if self.copies == "sync":
            return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in fields.items()}
        return await self.outbound.to_host(fields)

    async def close(self) -> None:
        """Stop the outbound waiter; copies still in flight are waited for."""
        await self.outbound.close()
        self.inbound.synchronize()
