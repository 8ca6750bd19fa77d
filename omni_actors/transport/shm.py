"""Shared-memory slab pool for large tensors between processes on one host.

One slab per link direction, created once by the sender: ``slots`` fixed-size slots in a
single file under ``/dev/shm``. Sending a large tensor copies it once into a free slot;
the receiver builds its tensor directly over the slot (no copy) and the slot returns to
the sender when the last object over that memory is garbage collected. Nothing is
created per message.

Slot ownership is one byte per slot in the slab's header: the sender flips it 0→1 when
it fills a slot, the receiver flips it 1→0 when it lets go. Each transition has exactly
one writer, and a single byte store cannot tear, so no lock (and no lock file) is needed.

Leaks: the file's name is removed (``unlink``) as soon as the receiver has mapped it,
after which the memory lives only as long as the two mappings — a crash of either side
cannot leave anything in ``/dev/shm``. Until then the name starts with
``omni-actors-<creator pid>-`` so a parent can :func:`sweep` what a dead worker left.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import struct
import weakref
from typing import Any

import numpy as np

from omni_actors.errors import ProtocolError

__all__ = ["SHM_DIR", "SHM_PREFIX", "SlabReader", "SlabWriter", "sweep"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
SHM_PREFIX = "omni-actors-"  # every slab's name starts with it (then the creator's pid)
_MAGIC = b"OMNISLAB"
_VERSION = 1
_HEADER = struct.Struct("<8sIIQ")  # magic, version, slots, slot_bytes
_STATE_OFFSET = 64
_PAGE = 4096


def _data_offset(slots: int) -> int:
    return -(-(_STATE_OFFSET + slots) // _PAGE) * _PAGE


def sweep(pid: int) -> int:
    """Remove slabs a (dead) process ``pid`` created and never unlinked; returns how many."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(SHM_DIR):
            if name.startswith(f"{SHM_PREFIX}{pid}-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(SHM_DIR, name))
                    removed += 1
    return removed


class SlabWriter:
    """The sending side: owns the slab file and fills its slots.

    Use :meth:`create`; call :meth:`unlink` once the peer has attached.
    """

    def __init__(self, name: str, slab_id: int, mm: mmap.mmap, slots: int, slot_bytes: int):
        self.name = name
        self.slab_id = slab_id
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._mm: mmap.mmap | None = mm
        self._state: np.ndarray[Any, np.dtype[np.uint8]] | None = np.frombuffer(
            mm, np.uint8, count=slots, offset=_STATE_OFFSET
        )
        self._data = _data_offset(slots)
        self._bytes: np.ndarray[Any, np.dtype[np.uint8]] | None = np.frombuffer(mm, np.uint8)
        self._linked = True
        self._finalizer = weakref.finalize(self, _unlink_quietly, os.path.join(SHM_DIR, name))

    @classmethod
    def create(cls, slots: int = 8, slot_bytes: int = 32 << 20, slab_id: int = 0) -> SlabWriter:
        """Create a slab of ``slots`` slots of ``slot_bytes`` (rounded up to a page).

        Pages are only backed by memory once written, so unused slots cost nothing.
        """
        if slots < 1 or slot_bytes < 1:
            raise ValueError("a slab needs at least one slot of at least one byte")
        slot_bytes = -(-slot_bytes // _PAGE) * _PAGE
        name = f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        path = os.path.join(SHM_DIR, name)
        size = _data_offset(slots) + slots * slot_bytes
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        _HEADER.pack_into(mm, 0, _MAGIC, _VERSION, slots, slot_bytes)
        return cls(name, slab_id, mm, slots, slot_bytes)

    def put(self, data: memoryview) -> tuple[int, int, int] | None:
        """Copy ``data`` into a free slot; ``(slab_id, slot, offset)`` or None (never waits)."""
        state = self._state
        mm = self._mm
        whole = self._bytes
        nbytes = data.nbytes
        if state is None or mm is None or whole is None or nbytes > self.slot_bytes:
            return None
        # The lowest free slot: reusing warm slots avoids faulting in fresh pages.
        found = mm.find(b"\x00", _STATE_OFFSET, _STATE_OFFSET + self.slots)
        if found < 0:
            return None
        slot = found - _STATE_OFFSET
        start = self._data + slot * self.slot_bytes
        # One copy, by numpy: it lets go of the GIL while it copies (an mmap slice
        # assignment holds it), so a model thread launching kernels is not held up.
        np.copyto(whole[start : start + nbytes], np.frombuffer(data, np.uint8))
        state[slot] = 1
        return self.slab_id, slot, 0

    def cancel(self, slot: int) -> None:
        """Free a slot filled by ``put`` whose message was never sent."""
        if self._state is not None and 0 <= slot < self.slots:
            self._state[slot] = 0

    def busy(self) -> int:
        """Slots currently held by the receiver."""
        return 0 if self._state is None else int(self._state.sum())

    def reset(self) -> None:
        """Mark every slot free (the receiver is known to be gone)."""
        if self._state is not None:
            self._state[:] = 0

    def unlink(self) -> None:
        """Remove the name from /dev/shm; both existing mappings stay valid."""
        if self._linked:
            self._linked = False
            self._finalizer.detach()
            _unlink_quietly(os.path.join(SHM_DIR, self.name))

    def close(self) -> None:
        """Unlink and unmap."""
        self.unlink()
        self._state = None
        self._bytes = None
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()

    def __enter__(self) -> SlabWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Mapping:
    """One attached slab on the receiving side."""

    def __init__(self, name: str, mm: mmap.mmap, slots: int, slot_bytes: int) -> None:
        self.name = name
        self.mm: mmap.mmap | None = mm
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.data = _data_offset(slots)
        self.state = np.frombuffer(mm, np.uint8, count=slots, offset=_STATE_OFFSET)
        self.held: set[int] = set()

    def release(self, slot: int) -> None:
        self.held.discard(slot)
        if self.mm is not None:
            self.state[slot] = 0


class SlabReader:
    """The receiving side: maps peers' slabs and hands out views of their slots."""

    def __init__(self) -> None:
        self._slabs: dict[int, _Mapping] = {}

    def attach(self, name: str, slab_id: int) -> None:
        """Map the slab ``name`` (offered by a peer) under ``slab_id``.

        Raises:
            ProtocolError: the name is not a slab of ours or its header is invalid.
        """
        if not name.startswith(SHM_PREFIX) or "/" in name:
            raise ProtocolError(f"{name!r} is not an omni-actors slab")
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        except OSError as exc:
            raise ProtocolError(f"cannot open slab {name!r}: {exc}") from None
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER.size:
                raise ProtocolError(f"slab {name!r} is too small")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, version, slots, slot_bytes = _HEADER.unpack_from(mm, 0)
        if magic != _MAGIC or version != _VERSION or slots < 1 or slot_bytes < 1:
            mm.close()
            raise ProtocolError(f"{name!r} has no valid slab header")
        if _data_offset(slots) + slots * slot_bytes > size:
            mm.close()
            raise ProtocolError(f"slab {name!r} is smaller than its header claims")
        self.forget(slab_id)
        self._slabs[slab_id] = _Mapping(name, mm, slots, slot_bytes)

    def attached(self, slab_id: int) -> bool:
        """Whether a slab is mapped under ``slab_id``."""
        mapping = self._slabs.get(slab_id)
        return mapping is not None and mapping.mm is not None

    def view(self, slab: int, slot: int, offset: int, nbytes: int) -> memoryview:
        """A writable view of a filled slot; the slot is released when it is collected.

        Raises:
            ProtocolError: unknown slab, or a slot/offset/size outside it.
        """
        mapping = self._slabs.get(slab)
        if mapping is None or mapping.mm is None:
            raise ProtocolError(f"unknown slab {slab}")
        if not 0 <= slot < mapping.slots:
            raise ProtocolError(f"slot {slot} outside slab {slab} ({mapping.slots} slots)")
        if offset < 0 or nbytes < 0 or offset + nbytes > mapping.slot_bytes:
            raise ProtocolError(f"{nbytes} bytes at {offset} do not fit a slot")
        if slot in mapping.held:
            raise ProtocolError(f"slot {slot} of slab {slab} is already in use")
        if mapping.state[slot] != 1:
            # A stale or forged descriptor: releasing it later would free a slot that a
            # newer message may own.
            raise ProtocolError(f"slot {slot} of slab {slab} holds no message")
        start = mapping.data + slot * mapping.slot_bytes + offset
        array = np.frombuffer(mapping.mm, np.uint8, count=nbytes, offset=start)
        mapping.held.add(slot)
        # Every tensor or view built over this memory keeps ``array`` alive; when the
        # last one goes, the slot goes back to the sender.
        weakref.finalize(array, mapping.release, slot)
        return array.data

    def release(self, slab: int, slot: int) -> None:
        """Free a slot no view was ever built over (its message was dropped)."""
        mapping = self._slabs.get(slab)
        if mapping is None or mapping.mm is None or not 0 <= slot < mapping.slots:
            return
        if slot not in mapping.held:
            mapping.state[slot] = 0

    def held(self, slab: int) -> int:
        """Slots of ``slab`` this process still holds views of."""
        mapping = self._slabs.get(slab)
        return 0 if mapping is None else len(mapping.held)

    def forget(self, slab: int) -> None:
        """Unmap ``slab`` (views still alive keep their memory until collected)."""
        mapping = self._slabs.pop(slab, None)
        if mapping is None:
            return
        if mapping.held:
            # Live views still owe the writer their slots: keep the mapping until their
            # finalizers have run (it is unmapped when the last of them is collected).
            return
        mm, mapping.mm = mapping.mm, None
        del mapping.state
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()

    def close(self) -> None:
        """Unmap every slab."""
        for slab in list(self._slabs):
            self.forget(slab)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
