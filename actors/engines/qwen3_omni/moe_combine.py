"""``combine``: the last step of the MoE experts' lean forward as one Triton kernel.

The lean forward (:mod:`.moe`) ends with the experts' output rows in expert order. Its
own last step gathers each token's ``K`` rows back to token order (``index_select``, a
copy of every row) and weighs them with one ``bmm``, which reads that copy again. The
kernel here reads each token's ``K`` rows where they lie and sums them weighted, in
float32, writing the token's row once: one program per (token, block of columns).

On one H200 at the thinker's width (2048), replayed from a CUDA graph, a layer's experts
took 0.677 ms at 2500 tokens against 0.781 with the gather and ``bmm`` (the talker's
width, 0.256 against 0.302), 0.423 against 0.426 at 32 tokens, and 0.100 against 0.093
at one token, where the launch costs more than the small ``bmm`` does
(``benchmarks/moe_experts.py --triton-combine``, docs/benchmarks.md). So :func:`serves`
takes it from :data:`MIN_TOKENS` tokens on: prefill forwards, not decode steps.

It is a ``torch.library.triton_op``: a compiled layer calls it as a kernel of its own,
and a CUDA graph captures it as any kernel. Where Triton is not installed (the CPU
build's machines) nothing here is defined but :func:`serves`, which says no.
"""

from __future__ import annotations

from typing import Any, Final

import torch

try:
    import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - the GPU machines have it
    triton = None

__all__ = ["MIN_TOKENS", "combine", "serves"]

MIN_TOKENS: Final = 64
"""The fewest tokens the kernel takes: below, the gather and ``bmm`` cost no more."""


def serves(rows: torch.Tensor, tokens: int) -> bool:
    """Whether :func:`combine` runs for ``tokens`` tokens of ``rows``: Triton installed,
    the rows on a CUDA device, at least :data:`MIN_TOKENS` tokens."""
    return triton is not None and rows.device.type == "cuda" and tokens >= MIN_TOKENS


def combine(rows: torch.Tensor, inverse: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_k weights[t, k] * rows[inverse[t * K + k]]`` for each token ``t``, summed in
    float32: [T, H] in ``rows``' dtype, for ``rows`` [T * K, H] in expert order (what
    ``moe._combine`` computes). Only where :func:`serves` says so."""
    result: torch.Tensor = torch.ops.omni_actors.moe_combine(rows, inverse, weights)
    return result


if triton is not None:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _combine_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        rows,
        inverse,
        weights,
        result,
        hidden,
        top_k: tl.constexpr,
        block: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        columns = tl.program_id(1) * block + tl.arange(0, block)
        inside = columns < hidden
        total = tl.zeros([block], dtype=tl.float32)
        for k in tl.static_range(top_k):
            row = tl.load(inverse + token * top_k + k).to(tl.int64)
            weight = tl.load(weights + token * top_k + k).to(tl.float32)
            values = tl.load(rows + row * hidden + columns, mask=inside, other=0.0)
            total += weight * values.to(tl.float32)
        tl.store(result + token * hidden + columns, total.to(result.dtype.element_ty), mask=inside)

    @torch.library.triton_op("omni_actors::moe_combine", mutates_args=())
    def _combine_op(
        rows: torch.Tensor, inverse: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        tokens, top_k = weights.shape
        hidden = rows.shape[1]
        result = rows.new_empty(tokens, hidden)
        block = min(1024, triton.next_power_of_2(hidden))
        grid: Any = (tokens, triton.cdiv(hidden, block))
        torch.library.wrap_triton(_combine_kernel)[grid](
            rows.contiguous(), inverse, weights.contiguous(), result, hidden, top_k, block
        )
        return result
