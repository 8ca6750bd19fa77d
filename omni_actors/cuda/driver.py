"""The few CUDA driver calls that torch does not expose without pickling: device memory
of our own and its inter-process handle.

torch shares device memory between processes through ``torch.multiprocessing``'s pickle
reductions and a reference-count file per allocation. Stages instead exchange a handle
once, as plain bytes in a msgspec message, over memory allocated for that purpose
(``cuMemAlloc``): the caching allocator never sees it, so it cannot be handed to another
tensor while a peer still maps it. Calls go through ``libcuda`` (installed with the
driver, so present wherever CUDA runs); they act on the calling thread's current
context, which torch's ``set_device`` makes the device's primary one.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from omni_actors.errors import OmniError

__all__ = [
    "DeviceBuffer",
    "IpcUnavailableError",
    "close_ipc",
    "ipc_handle",
    "mapped_tensor",
    "open_ipc",
]

IPC_HANDLE_BYTES = 64
_LAZY_PEER_ACCESS = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


class IpcUnavailableError(OmniError):
    """CUDA IPC cannot be used here (no driver, a refused handle, another host...)."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


@functools.cache
def _driver() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise IpcUnavailableError(f"no CUDA driver library: {exc}") from None
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
    lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]
    lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    return lib


def _check(call: str, result: int) -> None:
    if result != 0:
        raise IpcUnavailableError(f"{call} failed with CUDA driver error {result}")


def _current(device: torch.device) -> None:
    if not torch.cuda.is_available():
        raise IpcUnavailableError("CUDA is not available")
    torch.cuda.set_device(device)  # the primary context, current on this thread


class _CudaArray:
    """Device bytes that ``torch.as_tensor`` can wrap without a copy; the tensor keeps
    this object (and with it ``owner``) alive."""

    def __init__(self, pointer: int, nbytes: int, owner: object) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (pointer, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


class DeviceBuffer:
    """``nbytes`` of device memory from the driver, freed by :meth:`free` only: peers
    may map it, and no tensor here can tell whether they still read it.

    Attributes:
        tensor: a uint8 tensor over the whole buffer.
    """

    def __init__(self, device: torch.device, nbytes: int) -> None:
        _current(device)
        pointer = ctypes.c_uint64()
        _check("cuMemAlloc", _driver().cuMemAlloc_v2(ctypes.byref(pointer), nbytes))
        self.device = device
        self.pointer = pointer.value
        self.nbytes = nbytes
        self._freed = False
        try:
            self.tensor = _wrap(device, self.pointer, nbytes, self)
        except IpcUnavailableError:
            self._freed = True
            _driver().cuMemFree_v2(self.pointer)
            raise

    def handle(self) -> bytes:
        """The inter-process handle of this buffer (64 bytes)."""
        return ipc_handle(self.device, self.pointer)

    def free(self) -> None:
        """Give the memory back; the caller must know no copy still touches it."""
        if not self._freed:
            self._freed = True
            del self.tensor
            _driver().cuMemFree_v2(self.pointer)


def ipc_handle(device: torch.device, pointer: int) -> bytes:
    """The inter-process handle of driver memory at ``pointer``."""
    _current(device)
    handle = _Handle()
    _check("cuIpcGetMemHandle", _driver().cuIpcGetMemHandle(ctypes.byref(handle), pointer))
    # ``bytes(handle)``: every byte; ``handle.reserved`` would stop at the first zero.
    return bytes(handle)


def open_ipc(device: torch.device, handle: bytes) -> int:
    """Map memory another process exported (``handle``) into ``device``'s context.

    Raises:
        IpcUnavailableError: the handle is malformed or the driver refuses it (another
            host, a device without peer access, a dead exporter).
    """
    if len(handle) != IPC_HANDLE_BYTES:
        raise IpcUnavailableError(f"an IPC handle has {IPC_HANDLE_BYTES} bytes, not {len(handle)}")
    _current(device)
    pointer = ctypes.c_uint64()
    raw = _Handle.from_buffer_copy(handle)
    result = _driver().cuIpcOpenMemHandle_v2(ctypes.byref(pointer), raw, _LAZY_PEER_ACCESS)
    _check("cuIpcOpenMemHandle", result)
    return pointer.value


def close_ipc(device: torch.device, pointer: int) -> None:
    """Unmap memory mapped by :func:`open_ipc`."""
    _current(device)
    _driver().cuIpcCloseMemHandle(pointer)


def mapped_tensor(device: torch.device, pointer: int, nbytes: int, owner: object) -> torch.Tensor:
    """A uint8 tensor over mapped memory on ``device``; it keeps ``owner`` alive.

    Raises:
        IpcUnavailableError: torch would not place the memory itself on ``device`` (it
            would copy it there instead: a snapshot, not the mapping).
    """
    return _wrap(device, pointer, nbytes, owner)


def _wrap(device: torch.device, pointer: int, nbytes: int, owner: object) -> torch.Tensor:
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.as_tensor(_CudaArray(pointer, nbytes, owner), device=device)
    if tensor.device != device or (nbytes and tensor.data_ptr() != pointer):
        where = f"{tensor.device} at {tensor.data_ptr():#x}"
        raise IpcUnavailableError(f"memory at {pointer:#x} on {device} came back as {where}")
    return tensor
