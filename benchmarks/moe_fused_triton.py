"""The MoE experts in two Triton kernels, to time against the lean forward's grouped
matmuls and their glue (``moe_experts.py --triton-fused``).

The lean forward (:mod:`omni_actors.actors.engines.qwen3_omni.moe`) at the thinker's
width and 2500 tokens spends about 0.48 ms of a layer's 0.78 (from a CUDA graph, one
H200) in its two grouped matmuls and most of the rest in what surrounds them: the gather
of every (token, choice) row into expert order, the gate-and-up output written and read
back for ``act(gate) * up``, the gather back to token order and the weighing ``bmm``.
Here:

1. ``_gate_up_kernel``: per tile of one expert's rows (expert order, from the same stable
   sort) and a block of intermediate columns, reads the tokens' hidden rows where they lie
   (the gather is the tile's load), multiplies them by the expert's gate and up rows, and
   writes ``silu(gate) * up`` once;
2. ``_down_kernel``: per tile, the down projection of those rows, weighed by each row's
   routing weight in float32, written at its (token, choice) place;
3. one float32 sum over each token's choices (``torch.sum``).

Tiles are laid out on the device (no host sync, so the whole forward replays from a CUDA
graph): each expert's rows take ``ceil(rows / BLOCK_M)`` tiles, the grid holds as many
as the worst case (``ceil(T * K / BLOCK_M) + E``), and a tile past the last exits.
``--check`` compares it with the lean forward (on a CPU under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tile(tile_expert, tile_start, tile_stop, block_m: tl.constexpr):  # type: ignore[no-untyped-def]
    """This program's tile: its first and end rows, its expert, its rows and which are in."""
    tile = tl.program_id(0)
    start = tl.load(tile_start + tile)
    stop = tl.load(tile_stop + tile)
    expert = tl.load(tile_expert + tile).to(tl.int64)
    rows = start + tl.arange(0, block_m)
    return start, stop, expert, rows, rows < stop


@triton.jit
def _gate_up_kernel(  # type: ignore[no-untyped-def]
    hidden,
    weight,
    order,
    tile_expert,
    tile_start,
    tile_stop,
    inter,
    width,
    size,
    top_k: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    precision: tl.constexpr,
):
    start, stop, expert, rows, row_ok = _tile(tile_expert, tile_start, tile_stop, block_m)
    if start >= stop:
        return
    pairs = tl.load(order + rows, mask=row_ok, other=0)
    tokens = (pairs // top_k).to(tl.int64)
    cols = tl.program_id(1) * block_n + tl.arange(0, block_n)
    col_ok = cols < size
    base = weight + expert * (2 * size * width)
    gate = tl.zeros([block_m, block_n], dtype=tl.float32)
    up = tl.zeros([block_m, block_n], dtype=tl.float32)
    for k0 in range(0, width, block_k):
        ks = k0 + tl.arange(0, block_k)
        k_ok = ks < width
        a = tl.load(
            hidden + tokens[:, None] * width + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        b_mask = k_ok[:, None] & col_ok[None, :]
        b_gate = tl.load(base + cols[None, :] * width + ks[:, None], mask=b_mask, other=0.0)
        b_up = tl.load(base + (size + cols)[None, :] * width + ks[:, None], mask=b_mask, other=0.0)
        gate = tl.dot(a, b_gate, gate, input_precision=precision)
        up = tl.dot(a, b_up, up, input_precision=precision)
    out = gate * tl.sigmoid(gate) * up
    tl.store(
        inter + rows[:, None] * size + cols[None, :],
        out.to(inter.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _down_kernel(  # type: ignore[no-untyped-def]
    inter,
    weight,
    order,
    weights,
    tile_expert,
    tile_start,
    tile_stop,
    out,
    width,
    size,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    precision: tl.constexpr,
):
    start, stop, expert, rows, row_ok = _tile(tile_expert, tile_start, tile_stop, block_m)
    if start >= stop:
        return
    cols = tl.program_id(1) * block_n + tl.arange(0, block_n)
    col_ok = cols < width
    base = weight + expert * (width * size)
    acc = tl.zeros([block_m, block_n], dtype=tl.float32)
    for k0 in range(0, size, block_k):
        ks = k0 + tl.arange(0, block_k)
        k_ok = ks < size
        a = tl.load(
            inter + rows[:, None].to(tl.int64) * size + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        b = tl.load(
            base + cols[None, :] * size + ks[:, None],
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        acc = tl.dot(a, b, acc, input_precision=precision)
    pairs = tl.load(order + rows, mask=row_ok, other=0).to(tl.int64)
    weight_of = tl.load(weights + pairs, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(
        out + pairs[:, None] * width + cols[None, :],
        (acc * weight_of[:, None]).to(out.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def _tiles(
    offsets: torch.Tensor, pairs: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each grid tile's expert, first row and the expert's end row (0 past the last tile),
    from the experts' end offsets [E], on the device."""
    experts = offsets.shape[0]
    ends = offsets.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    tiles = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    grid = -(-pairs // block_m) + experts
    position = torch.arange(grid, device=offsets.device)
    expert = torch.searchsorted(tile_end, position, right=True)
    within = expert.clamp(max=experts - 1)
    first = tile_end[within] - tiles[within]
    start = ends[within] - counts[within] + (position - first) * block_m
    stop = torch.where(expert < experts, ends[within], torch.zeros_like(start))
    return within.to(torch.int32), start.to(torch.int32), stop.to(torch.int32)


def fused_experts(
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *,
    block_m: int = 64,
    block_n: int = 128,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """What ``moe.experts_forward`` computes with SiLU as the gate's activation (its
    docstring), by the kernels above: [T, H] in ``hidden``'s dtype."""
    tokens, top_k = top_k_index.shape
    experts, double, width = gate_up_proj.shape
    size = double // 2
    flat = top_k_index.reshape(-1).to(torch.uint8 if experts <= 256 else torch.int32)
    sorted_ids, order = torch.sort(flat, stable=True)
    bounds = torch.arange(experts, device=flat.device, dtype=flat.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds, right=True, out_int32=True)
    pairs = tokens * top_k
    tile_expert, tile_start, tile_stop = _tiles(offsets, pairs, block_m)
    grid_m = tile_expert.shape[0]
    rows = hidden.to(gate_up_proj.dtype).contiguous()
    order = order.to(torch.int32)
    precision = "ieee" if rows.dtype == torch.float32 else "tf32"
    inter = rows.new_empty(pairs, size)
    _gate_up_kernel[(grid_m, triton.cdiv(size, block_n))](
        rows,
        gate_up_proj.contiguous(),
        order,
        tile_expert,
        tile_start,
        tile_stop,
        inter,
        width,
        size,
        top_k,
        block_m,
        block_n,
        block_k,
        precision,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    out = rows.new_empty(pairs, width)
    _down_kernel[(grid_m, triton.cdiv(width, block_n))](
        inter,
        down_proj.contiguous(),
        order,
        top_k_weights.reshape(-1).contiguous(),
        tile_expert,
        tile_start,
        tile_stop,
        out,
        width,
        size,
        block_m,
        block_n,
        block_k,
        precision,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    summed = torch.sum(out.view(tokens, top_k, width), dim=1, dtype=torch.float32)
    return summed.to(hidden.dtype)


def _check() -> None:
    """The kernels against the lean forward on small shapes (fp32: to rounding)."""
    from omni_actors.actors.engines.qwen3_omni.moe import experts_forward

    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator().manual_seed(0)
    for tokens, experts, top_k, width, size in ((1, 8, 2, 48, 24), (37, 16, 4, 96, 40)):
        draw = lambda *shape: torch.randn(shape, generator=generator)  # noqa: E731
        gate_up = (draw(experts, 2 * size, width) * 0.2).to(device)
        down = (draw(experts, width, size) * 0.2).to(device)
        hidden = draw(tokens, width).to(device)
        weights, index = torch.softmax(draw(tokens, experts), -1).topk(top_k, dim=-1)
        index, weights = index.to(device), weights.to(device)
        want = experts_forward(gate_up, down, torch.nn.functional.silu, hidden, index, weights)
        for block_m in (16, 32):
            got = fused_experts(
                gate_up, down, hidden, index, weights, block_m=block_m, block_n=32, block_k=16
            )
            diff = float((got - want).abs().max())
            print({"tokens": tokens, "experts": experts, "block_m": block_m, "max_abs_diff": diff})
            assert diff < 1e-4, diff


if __name__ == "__main__":
    _check()
