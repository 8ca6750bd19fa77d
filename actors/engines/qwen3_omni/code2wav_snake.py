"""code2wav's SnakeBeta activation computed in place: the same samples, less memory traffic.

HF's ``Qwen3OmniMoeSnakeBeta`` computes ``x + 1 / (exp(beta) + eps) * sin(x * exp(alpha))^2``
with five temporaries per call and the two exponentials recomputed each time. In the
decoder's high-rate layers, which hold the most samples, that was a third of a code2wav
forward on a CPU. :class:`InPlaceSnakeBeta` computes the exponentials once and the rest
in one temporary, in the same order of operations, so its output is bit-for-bit HF's
(checked on a probe when the model loads). The model is for inference only: the
replacement holds constants, not parameters.
"""

from __future__ import annotations

import torch

from omni_actors.actors.engines.qwen3_omni.hf import Qwen3OmniMoeSnakeBeta

__all__ = ["InPlaceSnakeBeta", "replace_snake_activations"]


class InPlaceSnakeBeta(torch.nn.Module):
    """``source``'s activation, for inference; see the module docstring."""

    alpha: torch.Tensor
    scale: torch.Tensor

    def __init__(self, source: Qwen3OmniMoeSnakeBeta) -> None:
        super().__init__()
        with torch.no_grad():
            alpha = torch.exp(source.alpha.detach()).view(1, -1, 1)
            scale = 1.0 / (torch.exp(source.beta.detach()) + source.no_div_by_zero)
        self.register_buffer("alpha", alpha.contiguous())
        self.register_buffer("scale", scale.view(1, -1, 1).contiguous())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden + scale * sin(hidden * alpha)^2`` in one new tensor."""
        out = torch.mul(hidden, self.alpha)
        torch.sin(out, out=out)
        out.mul_(out)  # what pow(., 2) computes
        out.mul_(self.scale)
        return out.add_(hidden)


def replace_snake_activations(module: torch.nn.Module) -> int:
    """Swap every ``Qwen3OmniMoeSnakeBeta`` under ``module`` for an
    :class:`InPlaceSnakeBeta`; returns how many were swapped."""
    swapped = 0
    for name, child in module.named_children():
        if isinstance(child, Qwen3OmniMoeSnakeBeta):
            setattr(module, name, InPlaceSnakeBeta(child))
            swapped += 1
        else:
            swapped += replace_snake_activations(child)
    return swapped
