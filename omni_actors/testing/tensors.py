"""Tensors for transfer tests: random bit patterns of every dtype, compared bit for bit.

A transfer must move bytes, not values: NaNs, negative zeros and subnormals must arrive
as they left, which ``torch.equal`` on floats would not check.
"""

from __future__ import annotations

import torch

from omni_actors.protocols.tensors import TORCH_DTYPES

__all__ = ["SENDABLE_DTYPES", "random_bits", "same_bits"]

SENDABLE_DTYPES: tuple[torch.dtype, ...] = tuple(TORCH_DTYPES.values())
"""Every dtype the transport (and a device link) carries."""


def random_bits(
    dtype: torch.dtype, shape: tuple[int, ...], seed: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` whose bytes are random (``bool``: 0 or 1)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    data = torch.randint(0, 256, (size,), dtype=torch.uint8, device=device, generator=gen)
    if dtype is torch.bool:
        return (data % 2).to(torch.bool).view(shape)
    return data.view(dtype).view(shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (on any devices)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(_raw(a).cpu(), _raw(b).cpu()))


def _raw(t: torch.Tensor) -> torch.Tensor:
    flat = t.contiguous().view(-1)
    return flat.view(torch.uint8) if flat.dtype is not torch.bool else flat
