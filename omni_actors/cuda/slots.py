"""``SlotPool``: host memory for transfers, allocated once, in fixed-size slots.

A tensor copied out of (or into) a GPU needs page-locked host memory for the copy to be
asynchronous, and allocating page-locked memory costs milliseconds. A pool takes it once,
at start, and lends it out a slot at a time.

A lent slot comes back when the last object over its memory is garbage collected: the
slot is handed out as a numpy view, every tensor built over it keeps that view alive, and
a finalizer on the view returns the slot. So whoever ends up holding the data — the
transport while it copies it into a frame or a shared-memory slot, a stage in this
process that keeps it — holds the slot, and nobody has to remember to give it back.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import torch

__all__ = ["SlotPool", "host_tensor"]

_ALIGN = 4096


class SlotPool:
    """``slots`` slots of ``slot_bytes`` bytes of host memory, page-locked if ``pinned``.

    Thread-safe: slots are taken on the thread that starts a copy and come back on
    whichever thread drops the last reference.
    """

    def __init__(self, slots: int, slot_bytes: int, *, pinned: bool) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError("a slot pool needs at least one slot of at least one byte")
        self.slots = slots
        self.slot_bytes = -(-slot_bytes // _ALIGN) * _ALIGN
        self.pinned = pinned
        memory = torch.empty(slots * self.slot_bytes, dtype=torch.uint8, pin_memory=pinned)
        self._memory = memory  # owns the allocation (a pinned one is freed with it)
        self._bytes: np.ndarray[Any, np.dtype[np.uint8]] = memory.numpy()
        self._lock = threading.Lock()
        # Taken from the end: the slot used last is warm in the caches and the TLB.
        self._free = list(range(slots - 1, -1, -1))
        self.taken = 0
        self.overflows = 0

    @property
    def busy(self) -> int:
        """Slots lent out and not yet returned."""
        with self._lock:
            return self.slots - len(self._free)

    def take(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
        """A view of ``nbytes`` at the start of a free slot, or None (too big, none free).

        A None is counted in :attr:`overflows`: the caller allocates for itself.
        """
        with self._lock:
            if nbytes > self.slot_bytes or not self._free:
                self.overflows += 1
                return None
            slot = self._free.pop()
            self.taken += 1
        start = slot * self.slot_bytes
        view = self._bytes[start : start + nbytes]
        weakref.finalize(view, self._give_back, slot)
        return view

    def _give_back(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)


def host_tensor(pool: SlotPool, like: torch.Tensor) -> torch.Tensor:
    """A host tensor of ``like``'s shape and dtype, in a slot of ``pool`` when one is free.

    Otherwise it is allocated on its own (page-locked when the pool is), so a burst
    larger than the pool slows down a little instead of waiting or failing.
    """
    nbytes = like.numel() * like.element_size()
    view = pool.take(nbytes) if nbytes else None
    if view is None:
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=pool.pinned and nbytes > 0)
    # from_numpy keeps ``view`` (and so the slot) alive for as long as any tensor over it.
    return torch.from_numpy(view).view(like.dtype).view(like.shape)
