"""Seeded random weights that depend on the seed and each tensor's name only.

Releases of random weights (for tests and benches, where nothing can be downloaded) must
come out the same for the same seed. Drawing them with transformers' initializers after
``torch.manual_seed`` does not ensure that: those draw from the process's global RNG,
which every thread shares, so a model drawn while another thread draws too (a stage
that prepares its checkpoint on first use while the pipeline's other stages load) came
out different, now and then. Here each tensor is drawn from a generator of its own,
seeded by the seed and the tensor's name, so neither other threads nor the order of
drawing change it: norm weights are ones, biases zeros, snake activations'
``alpha``/``beta`` zeros (their log-scale identity), layer scales 0.01, and every other
tensor comes from a normal of standard deviation :data:`STD` (transformers' usual
``initializer_range``).
"""

from __future__ import annotations

import zlib
from collections.abc import Collection
from typing import Final

import torch

__all__ = ["STD", "redraw", "seeded_tensor"]

STD: Final = 0.02


def seeded_tensor(
    name: str, shape: torch.Size, dtype: torch.dtype, device: torch.device, seed: int
) -> torch.Tensor:
    """Tensor ``name``'s values (module docstring), the same for the same seed."""
    leaf = name.rsplit(".", 2)
    last = leaf[-1]
    module = leaf[-2] if len(leaf) > 1 else ""
    if last == "bias" or last in ("alpha", "beta"):
        return torch.zeros(shape, dtype=dtype, device=device)
    if ("norm" in module and last == "weight") or module in ("ln_q", "ln_post"):
        return torch.ones(shape, dtype=dtype, device=device)
    if last == "scale":
        return torch.full(shape, 0.01, dtype=dtype, device=device)
    generator = torch.Generator(device=device).manual_seed(
        seed * 1_000_003 + zlib.crc32(name.encode())
    )
    values = torch.empty(shape, dtype=torch.float32, device=device)
    return values.normal_(0.0, STD, generator=generator).to(dtype)


@torch.no_grad()
def redraw(module: torch.nn.Module, seed: int, *, keep: Collection[str] = ()) -> None:
    """Draw every parameter of ``module`` again with :func:`seeded_tensor`, in place,
    but those named in ``keep`` (values its constructor sets, such as sinusoidal
    positions); a parameter shared by several names is drawn under its first."""
    for name, parameter in module.named_parameters():
        if name not in keep:
            parameter.copy_(
                seeded_tensor(name, parameter.shape, parameter.dtype, parameter.device, seed)
            )
