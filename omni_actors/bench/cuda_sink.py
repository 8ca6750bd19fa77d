"""The receiving side of ``bench cuda``: an actor in a worker process that takes hidden
states the way a downstream stage would.

Its own module (not :mod:`omni_actors.bench.cuda`) so the worker imports only what it
runs: the actor, its messages and :class:`~omni_actors.cuda.DeviceInbound`.
"""

from __future__ import annotations

import time
from typing import Literal

import msgspec
import torch

from omni_actors import Actor
from omni_actors.actors.engines.torch_engine import resolve_device
from omni_actors.cuda import DeviceInbound
from omni_actors.protocols.message import Request

__all__ = ["Arrived", "Collect", "Hidden", "Hop", "HiddenSink", "Tally"]


class Tally(msgspec.Struct, tag="tally", frozen=True):
    """sink -> bench: the hand-offs taken since the last :class:`Collect`."""

    count: int
    nbytes: int
    in_order: bool
    """Whether each sequence number was the one after the last (no loss, no reordering)."""


class Arrived(msgspec.Struct, tag="arrived", frozen=True):
    """sink -> bench: a :class:`Hop`'s tensor is on the sink's device."""

    seq: int
    monotonic_ns: int
    """When it was, on ``CLOCK_MONOTONIC``: one clock for every process of a host."""


class Hidden(msgspec.Struct, tag="hidden", frozen=True):
    """bench -> sink: one forward step's hidden states, counted and dropped."""

    seq: int
    hidden: torch.Tensor


class Collect(msgspec.Struct, Request[Tally], tag="collect", frozen=True):
    """bench -> sink: what arrived since the last one (queued behind earlier tells)."""


class Hop(msgspec.Struct, Request[Arrived], tag="hop", frozen=True):
    """bench -> sink: load ``hidden`` onto the sink's device and say when it got there.

    ``copies``: ``async`` loads through :class:`~omni_actors.cuda.DeviceInbound` (a
    transfer stream, pinned staging), ``sync`` with ``.to(device)``, the baseline.
    """

    seq: int
    hidden: torch.Tensor
    copies: Literal["async", "sync"] = "async"


SinkMessage = Hidden | Collect | Hop


class HiddenSink(Actor[SinkMessage]):
    """Counts :class:`Hidden` hand-offs; loads :class:`Hop` tensors onto ``device``.

    Args:
        device: where a :class:`Hop` is loaded (``cpu``, ``cuda``, ``cuda:N``).
        slot_bytes: the size of the inbound pinned slots (the largest hand-off).
    """

    replies = Tally | Arrived

    def __init__(self, device: str, slot_bytes: int) -> None:
        self._device = resolve_device(device)  # with its index: set_device wants one
        self._slot_bytes = slot_bytes
        self._inbound: DeviceInbound | None = None
        self._count = 0
        self._nbytes = 0
        self._next_seq: int | None = None
        self._in_order = True

    async def on_start(self) -> None:
        """Take the device and the inbound slots before the first message is timed."""
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        self._inbound = DeviceInbound(self._device, slots=2, slot_bytes=self._slot_bytes)

    async def receive(self, message: SinkMessage) -> Tally | Arrived | None:
        """Count, report or load; see each message."""
        match message:
            case Hidden(seq=seq, hidden=hidden):
                if self._next_seq is not None and seq != self._next_seq:
                    self._in_order = False
                self._next_seq = seq + 1
                self._count += 1
                self._nbytes += hidden.numel() * hidden.element_size()
                return None
            case Collect():
                tally = Tally(self._count, self._nbytes, self._in_order)
                self._count, self._nbytes, self._next_seq, self._in_order = 0, 0, None, True
                return tally
            case Hop(seq=seq, hidden=hidden, copies=copies):
                self._load(hidden, copies)
                return Arrived(seq, time.clock_gettime_ns(time.CLOCK_MONOTONIC))

    def _load(self, hidden: torch.Tensor, copies: Literal["async", "sync"]) -> None:
        """``hidden`` on this actor's device, with the copy complete when this returns."""
        inbound = self._inbound
        if inbound is None:
            raise RuntimeError("HiddenSink.on_start has not run")
        if copies == "sync":
            loaded = hidden.to(self._device)
            if self._device.type == "cuda":
                torch.cuda.current_stream(self._device).synchronize()
        else:
            loaded = inbound.load({"hidden": hidden})["hidden"]
            # A stage's compute stream would wait on the copy on the device; the bench
            # waits on the host, to timestamp the moment the copy is complete.
            inbound.synchronize()
        del loaded

    async def on_stop(self) -> None:
        """Let copies still in flight finish before their host sources go."""
        if self._inbound is not None:
            self._inbound.synchronize()
