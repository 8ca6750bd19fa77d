"""The experts of the thinker's and talker's sparse MoE blocks, computed with few kernels.

transformers' ``grouped_mm`` experts forward spends more of a full-size prefill in the
glue around its two grouped matmuls than in the matmuls: on one H200 (8-layer thinker,
2500-token prompt) 3.4 ms of ``_grouped_mm`` a forward beside 2.7 ms of ``mul``, 2.5 ms
of ``masked_fill_``, 2.2 ms of other elementwise kernels, 1.4 ms of copies and 1.2 ms of
gathers. The three ``masked_fill`` a layer are its expert-parallel sentinel handling
(transformers 5.17 zeroes the rows of expert ids ``>= num_experts`` before the first
grouped matmul and after each; 5.19 skips them unless the model is expert-parallel):
here every id names an expert, so no row is a sentinel and no mask is computed.

:func:`experts_forward` computes the same sum with about a dozen kernels a layer and no host
sync (so it can be captured in a CUDA graph): one stable sort of the flat expert ids,
each expert's end offset by one ``searchsorted``, one gather of the token rows, the
gate-and-up grouped matmul, ``act(gate) * up``, the down grouped matmul, one gather
back to (token, choice) order, and one batched matmul that weighs each token's choices
and sums them, accumulating in fp32 as transformers' ``view(T, K, H).sum(1)`` does
(``bmm``'s own accumulator, one rounding at the end; in fp32 the sums equal transformers'
up to rounding order).

:func:`install` swaps every experts module of a model for a :class:`LeanExperts` holding
the same parameters under the same names (one model instance: its config, its class and
other models are untouched), as :mod:`.code2wav_snake` swaps activations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from pydantic import BaseModel

from omni_actors.actors.engines.qwen3_omni import moe_combine
from omni_actors.actors.engines.qwen3_omni.hf import (
    Qwen3OmniMoeTalkerTextExperts,
    Qwen3OmniMoeThinkerTextExperts,
)

__all__ = [
    "LeanExperts",
    "MoeArgs",
    "MoeCombine",
    "MoeImplementation",
    "experts_forward",
    "install",
]

MoeImplementation = Literal["lean", "transformers"]
"""Whose forward the MoE experts run: :func:`experts_forward` or transformers' own (its
configured ``experts_implementation``)."""

MoeCombine = Literal["gather", "triton"]
"""How :func:`experts_forward` weighs each token's rows: a gather and a ``bmm``, or
:mod:`.moe_combine`'s Triton kernel where it serves (else the gather)."""

GroupedMm = Callable[..., torch.Tensor]

# torch >= 2.10 names it publicly; the private name is the same kernel in earlier releases.
_GROUPED_MM: GroupedMm | None = getattr(
    torch.nn.functional, "grouped_mm", getattr(torch, "_grouped_mm", None)
)


class MoeArgs(BaseModel):
    """The arguments of an engine whose model has MoE experts.

    Attributes:
        moe: ``lean`` runs the experts with :func:`experts_forward`; ``transformers``
            with transformers' configured implementation (to compare the two).
        moe_combine: ``triton`` (the default) ends the lean forward of 64 tokens or more
            on a GPU with one Triton kernel (:mod:`.moe_combine`: 13% off a 2500-token
            layer's experts on an H200, 18% at 7500), elsewhere with a gather and a
            ``bmm``; ``gather`` always with the gather and ``bmm``.
    """

    moe: MoeImplementation = "lean"
    moe_combine: MoeCombine = "triton"


def experts_forward(
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    combine: MoeCombine = "gather",
) -> torch.Tensor:
    """The experts' output for each token: ``sum_k w[t, k] * down_e(act(gate_e(x)) * up_e(x))``
    with ``e = top_k_index[t, k]``.

    Args:
        gate_up_proj: [E, 2I, H], each expert's gate rows then its up rows.
        down_proj: [E, H, I].
        act: the gate's activation.
        hidden: [T, H].
        top_k_index: [T, K] expert ids, each in ``[0, E)``.
        top_k_weights: [T, K] routing weights.
        combine: how each token's rows are weighed (:data:`MoeCombine`).

    Returns:
        [T, H] in ``hidden``'s dtype.
    """
    top_k = top_k_index.shape[1]
    experts = gate_up_proj.shape[0]
    # Sorted as the narrowest integers that hold them: the device's radix sort makes a
    # pass per byte of its keys, eight for int64 ids that carry one byte (128 experts).
    flat = top_k_index.reshape(-1).to(_key_dtype(experts))
    # Stable: rows of one expert keep their token order, whatever the device's sort.
    sorted_ids, order = torch.sort(flat, stable=True)
    # End offset of each expert's rows: how many ids are <= it (an expert without
    # tokens ends where the one before it does: an empty group).
    bounds = torch.arange(experts, device=flat.device, dtype=flat.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds, right=True, out_int32=True)
    rows = hidden.index_select(0, order // top_k).to(gate_up_proj.dtype)
    gate_up = _grouped_mm(rows, gate_up_proj.transpose(-2, -1), offsets)
    gate, up = gate_up.chunk(2, dim=-1)
    out = _grouped_mm(act(gate) * up, down_proj.transpose(-2, -1), offsets)
    # Back to (token, choice) order by a gather through the inverse permutation: on an
    # H200 a row gather ran about 3x faster than scattering the rows (``index_copy_``);
    # inverting the permutation scatters one int per row.
    positions = torch.arange(order.numel(), device=order.device)
    inverse = torch.empty_like(order).scatter_(0, order, positions)
    weights = top_k_weights.to(out.dtype)
    if combine == "triton" and moe_combine.serves(out, top_k_index.shape[0]):
        return moe_combine.combine(out, inverse, weights).to(hidden.dtype)
    return _combine(out, inverse, weights).to(hidden.dtype)


def _combine(rows: torch.Tensor, inverse: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_k weights[t, k] * rows[inverse[t * K + k]]`` for each token ``t``, summed in
    float32: [T, H] in ``rows``' dtype, for ``rows`` [T * K, H] in expert order."""
    tokens, top_k = weights.shape
    unsorted = rows.index_select(0, inverse).view(tokens, top_k, -1)
    combined = torch.bmm(weights.unsqueeze(1), unsorted)  # [T, 1, H]
    return combined.view(tokens, -1)


def _key_dtype(experts: int) -> torch.dtype:
    """The narrowest integer type that holds ids ``0 .. experts - 1``."""
    if experts <= 256:
        return torch.uint8
    return torch.int16 if experts <= 32768 else torch.int32


def _grouped_mm(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``rows[start_e:end_e] @ weight[e]`` for each expert, stacked: [S, N] for
    ``weight`` [E, K, N] and ``offsets`` the experts' end offsets."""
    if _GROUPED_MM is not None and _kernel_serves(weight):
        return _GROUPED_MM(rows, weight, offs=offsets)
    looped: torch.Tensor = _per_expert(rows, weight, offsets)
    return looped


def _kernel_serves(weight: torch.Tensor) -> bool:
    """Whether torch's grouped matmul runs here (transformers' own conditions, for the
    torch releases the project supports)."""
    # Traced, the grouped matmul takes bfloat16 only (its meta function says so).
    if torch.compiler.is_compiling() and weight.dtype != torch.bfloat16:
        return False
    if weight.device.type == "cpu":
        return True
    if weight.device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(weight.device) >= (8, 0)


# A custom op, so that a compiled layer calls the loop as one opaque op (as transformers'
# own fallback is) instead of breaking its graph at the host sync.
@torch.library.custom_op("omni_actors::grouped_mm_per_expert", mutates_args=())
def _per_expert(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """What the grouped matmul computes, one matmul per expert with rows (one host sync:
    where the kernel does not run, a step is not captured in a graph either)."""
    out = rows.new_zeros(rows.shape[0], weight.shape[-1])
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        if end > start:
            torch.mm(rows[start:end], weight[expert], out=out[start:end])
        start = end
    return out


@_per_expert.register_fake
def _per_expert_shape(
    rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], weight.shape[-1])


ExpertsModule = Qwen3OmniMoeThinkerTextExperts | Qwen3OmniMoeTalkerTextExperts


class LeanExperts(torch.nn.Module):
    """``source``'s experts run by :func:`experts_forward` (weighing their rows as
    ``combine`` says): the same parameter objects under the same names (``gate_up_proj``,
    ``down_proj``), so the state dict is unchanged."""

    def __init__(self, source: ExpertsModule, combine: MoeCombine = "triton") -> None:
        super().__init__()
        self.combine: MoeCombine = combine
        if getattr(source, "is_transposed", False):
            # Not Qwen3-Omni's layout in any supported transformers release.
            raise ValueError(
                f"{type(source).__name__} stores transposed weights: use moe=transformers"
            )
        self.num_experts = int(source.num_experts)
        self.gate_up_proj = source.gate_up_proj
        self.down_proj = source.down_proj
        self.act_fn: Callable[[torch.Tensor], torch.Tensor] = source.act_fn

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """The experts' output, [T, H] (:func:`experts_forward`)."""
        return experts_forward(
            self.gate_up_proj,
            self.down_proj,
            self.act_fn,
            hidden_states,
            top_k_index,
            top_k_weights,
            self.combine,
        )


def install(model: torch.nn.Module, combine: MoeCombine = "triton") -> int:
    """Swap every thinker or talker experts module under ``model`` for a
    :class:`LeanExperts` weighing its rows as ``combine`` says; returns how many were
    swapped."""
    swapped = 0
    for name, child in model.named_children():
        if isinstance(child, (Qwen3OmniMoeThinkerTextExperts, Qwen3OmniMoeTalkerTextExperts)):
            setattr(model, name, LeanExperts(child, combine))
            swapped += 1
        else:
            swapped += install(child, combine)
    return swapped
