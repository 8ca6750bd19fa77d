"""How a tensor is described on the wire; its bytes travel outside the header.

A ``TensorDesc`` replaces every ``torch.Tensor`` / ``numpy.ndarray`` inside a message.
Exactly one placement is used: ``data`` (small tensors, inline in the header),
``buffer`` (index of an out-of-band ZeroMQ frame after the header), or
``slab``/``slot``/``offset`` (a slot in a shared-memory slab the receiver has mapped).
"""

from __future__ import annotations

import msgspec

__all__ = ["LIB_NUMPY", "LIB_TORCH", "TensorDesc"]

LIB_TORCH = 0
LIB_NUMPY = 1


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
