"""A Triton kernel for the last step of the MoE experts' lean forward, to time against
its ``index_select`` and ``bmm`` (``moe_experts.py --triton-combine``).

The lean forward (:mod:`omni_actors.actors.engines.qwen3_omni.moe`) ends by gathering
the experts' output rows back to token order and weighing each token's ``K`` rows with
one ``bmm``: the gather writes a copy of every row that the ``bmm`` reads again. Here one
program per (token, block of columns) reads the token's ``K`` rows where they lie and
sums them weighted, in float32, writing the token's row once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _combine_kernel(  # type: ignore[no-untyped-def]
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


def combine(rows: torch.Tensor, inverse: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """What ``moe._combine`` computes (its docstring), by :func:`_combine_kernel`."""
    tokens, top_k = weights.shape
    hidden = rows.shape[1]
    result = rows.new_empty(tokens, hidden)
    block = min(1024, triton.next_power_of_2(hidden))
    grid = (tokens, triton.cdiv(hidden, block))
    _combine_kernel[grid](
        rows.contiguous(), inverse, weights.contiguous(), result, hidden, top_k, block
    )
    return result
