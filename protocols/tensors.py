"""How a tensor is described on the wire; its bytes travel outside the header.

A ``TensorDesc`` replaces every ``torch.Tensor`` / ``numpy.ndarray`` inside a message.
Exactly one placement is used: ``data`` (small tensors, inline in the header),
``buffer`` (index of an out-of-band ZeroMQ frame after the header), or
``slab``/``slot``/``offset`` (a slot in a shared-memory slab the receiver has mapped).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import torch

__all__ = [
    "LIB_NUMPY",
    "LIB_TORCH",
    "MAX_DIMS",
    "NUMPY_DTYPES",
    "TORCH_DTYPES",
    "TORCH_NAMES",
    "TensorDesc",
]

LIB_TORCH = 0
LIB_NUMPY = 1

# The dtypes a tensor may travel as, by the name a ``TensorDesc`` carries. Every path
# that moves tensors (the codec, CUDA IPC slots, the caller's send checks) reads them
# here, so a dtype is sendable everywhere or nowhere.
TORCH_DTYPES: dict[str, torch.dtype] = {  # every dtype a tensor may be sent as, by name
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
TORCH_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name)
    for name in [
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    ]
}
MAX_DIMS = 32  # the most dimensions a tensor on the wire may have


class TensorDesc(msgspec.Struct, tag="T", frozen=True, array_like=True):
    """Descriptor of one tensor: library, dtype name, shape, and where its bytes are."""

    lib: int
    dtype: str
    shape: tuple[int, ...]
    data: bytes | None = None
    buffer: int = -1
    slab: int = -1
    slot: int = -1
    offset: int = 0
    nbytes: int = 0
