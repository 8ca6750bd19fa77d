"""``attend``: single-position rows' attention read in place from the slot cache, as one
Triton kernel.

A decode row of the slot cache (:mod:`.slot_cache`) otherwise attends a gathered copy of
its slot's keys and values: ``index_select`` over the rows' slots, in every layer, then
the attention reads the copy again. At full size on an H200 that is 268 MB copied and
read a layer at 32 rows and a 4096-position span, about 0.3 ms of every layer of a
thinker decode step (and of each fresh prefill forward that carries decode rows,
docs/benchmarks.md). The kernel reads each row's keys and values where they lie, and only
up to the row's own position.

Each program takes one (row, key head, part of the span): the row's query heads of that
key head (grouped-query attention: a key head's query heads read its keys once) over at
most :data:`PART` positions (fewer where there are few rows, so that the programs fill
the GPU), keeping a running maximum and sum (flash decoding). The parts are then merged
by their maxima. Every shape depends on the rows and the span alone, never on the rows'
positions: a CUDA graph captures it, and replays it for any positions within the span.

It is a ``torch.library.triton_op``: a compiled layer calls it as a kernel of its own.
Where Triton is not installed (the CPU build's machines) nothing here is defined but
:func:`serves`, which says no.
"""

from __future__ import annotations

import os
from typing import Any, Final

import torch

try:
    import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - the GPU machines have it
    triton = None

__all__ = ["PART", "attend", "serves"]

PART: Final = 512
"""The most positions one program reads."""

_BLOCK: Final = 64
"""Positions a program's loop reads at a time, and the fewest one program reads."""

_PROGRAMS: Final = 512
"""How many programs a call aims for (an H200 has 132 multiprocessors): few rows split
their spans into shorter parts, so one row's attention at a 4096-position span runs in
64 parts of 64 positions per key head, not 8 of 512 (measured on an H200, 8 parts left
one row's step slower than the gathered copy)."""


def _part(rows: int, kv_heads: int, span: int) -> int:
    """Positions per program for ``rows`` rows of ``kv_heads`` key heads over ``span``: a
    multiple of :data:`_BLOCK` from it to :data:`PART`, short enough that the programs
    reach :data:`_PROGRAMS` where the span allows."""
    parts = -(-_PROGRAMS // (rows * kv_heads))
    part = -(-span // parts)
    return min(PART, max(_BLOCK, -(-part // _BLOCK) * _BLOCK))


_INTERPRETED: Final = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton's interpreter runs kernels on a CPU's tensors (the tests', where no GPU is)."""


def serves(keys: torch.Tensor, heads: int) -> bool:
    """Whether :func:`attend` runs over the cache layer ``keys`` [slots, kv_heads, len,
    dim] for ``heads`` query heads: Triton installed, ``keys`` on a CUDA device (or
    Triton interpreting), a head dim that is a power of two from 16, whole groups of
    query heads."""
    dim, kv_heads = keys.shape[-1], keys.shape[1]
    shaped = dim >= 16 and dim & (dim - 1) == 0 and heads % kv_heads == 0
    placed = keys.device.type == "cuda" or _INTERPRETED
    return triton is not None and placed and shaped


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    scale: float | None,
    span: int,
) -> torch.Tensor:
    """Row ``i``'s query [heads, dim] of ``query`` [R, heads, dim] over positions ``0 ..
    starts[i]`` of slot ``slots[i]`` of the cache layer ``keys``/``values`` [slots,
    kv_heads, len, dim] (each at most ``span``); [R, heads, dim] in ``query``'s dtype.
    Only where :func:`serves` says so (the tests run it on a CPU through Triton's
    interpreter)."""
    scaling = scale if scale is not None else query.shape[-1] ** -0.5
    out: torch.Tensor = torch.ops.omni_actors.slot_decode_attention(
        query, keys, values, slots, starts, scaling, span
    )
    return out


if triton is not None:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _parts_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        query,
        keys,
        values,
        slots,
        starts,
        acc,
        top,
        total,
        slot_stride,
        head_stride,
        position_stride,
        scale,
        part,
        group: tl.constexpr,
        block_g: tl.constexpr,
        block_n: tl.constexpr,
        dim: tl.constexpr,
        parts: tl.constexpr,
    ):
        # Compiled layers pass a Python float as float64: every score stays float32.
        scale = tl.cast(scale, tl.float32)
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        piece = tl.program_id(2)
        kv_heads = tl.num_programs(1)
        slot = tl.load(slots + row).to(tl.int64)
        last = tl.load(starts + row).to(tl.int32)
        g = tl.arange(0, block_g)
        d = tl.arange(0, dim)
        q_heads = head * group + g
        q = tl.load(
            query + (row * kv_heads * group + q_heads)[:, None] * dim + d[None, :],
            mask=(g < group)[:, None],
            other=0.0,
        )
        base = slot * slot_stride + head * head_stride
        low = piece * part
        high = tl.minimum(low + part, last + 1)
        best = tl.full([block_g], float("-inf"), tl.float32)
        sums = tl.zeros([block_g], tl.float32)
        weighted = tl.zeros([block_g, dim], tl.float32)
        for first in range(low, high, block_n):
            n = first + tl.arange(0, block_n)
            inside = n < high
            offsets = base + n.to(tl.int64)[:, None] * position_stride + d[None, :]
            k = tl.load(keys + offsets, mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * scale
            scores = tl.where(inside[None, :], scores, float("-inf"))
            new = tl.maximum(best, tl.max(scores, 1))
            p = tl.exp(scores - new[:, None])
            alpha = tl.exp(best - new)
            sums = sums * alpha + tl.sum(p, 1)
            v = tl.load(values + offsets, mask=inside[:, None], other=0.0)
            weighted = weighted * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            best = new
        at = (row * kv_heads + head) * parts + piece
        tl.store(acc + (at * block_g + g)[:, None] * dim + d[None, :], weighted)
        tl.store(top + at * block_g + g, best)
        tl.store(total + at * block_g + g, sums)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _merge_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        acc,
        top,
        total,
        out,
        group: tl.constexpr,
        block_g: tl.constexpr,
        dim: tl.constexpr,
        parts: tl.constexpr,
        block_p: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        kv_heads = tl.num_programs(1)
        p = tl.arange(0, block_p)
        g = tl.arange(0, block_g)
        d = tl.arange(0, dim)
        first = (row * kv_heads + head) * parts
        offsets = (first + p)[:, None] * block_g + g[None, :]
        inside = (p < parts)[:, None]
        tops = tl.load(top + offsets, mask=inside, other=float("-inf"))
        best = tl.max(tops, 0)
        sums = tl.load(total + offsets, mask=inside, other=0.0)
        weights = tl.exp(tops - best[None, :])
        merged = tl.zeros([block_g, dim], tl.float32)
        # One part's [group, dim] at a time: up to 64 parts of them at once would not fit
        # a program's registers. A part that read nothing (its maximum -inf) weighs 0.
        for piece in range(parts):
            at = (first + piece) * block_g + g
            weight = tl.exp(tl.load(top + at) - best)
            merged += tl.load(acc + at[:, None] * dim + d[None, :]) * weight[:, None]
        merged = merged / tl.sum(sums * weights, 0)[:, None]
        q_heads = head * group + g
        tl.store(
            out + (row * kv_heads * group + q_heads)[:, None] * dim + d[None, :],
            merged.to(out.dtype.element_ty),
            mask=(g < group)[:, None],
        )

    @torch.library.triton_op("omni_actors::slot_decode_attention", mutates_args=())
    def _attend_op(
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        slots: torch.Tensor,
        starts: torch.Tensor,
        scale: float,
        span: int,
    ) -> torch.Tensor:
        if keys.stride() != values.stride() or keys.stride(3) != 1:
            raise ValueError("keys and values must be laid out alike, each row contiguous")
        rows, heads, dim = query.shape
        kv_heads = keys.shape[1]
        group = heads // kv_heads
        part = _part(rows, kv_heads, span)
        parts = triton.cdiv(span, part)
        block_g = max(16, triton.next_power_of_2(group))
        shape = (rows, kv_heads, parts, block_g)
        acc = query.new_empty((*shape, dim), dtype=torch.float32)
        top = query.new_empty(shape, dtype=torch.float32)
        total = query.new_empty(shape, dtype=torch.float32)
        grid: Any = (rows, kv_heads, parts)
        torch.library.wrap_triton(_parts_kernel)[grid](
            query.contiguous(),
            keys,
            values,
            slots.contiguous(),
            starts.contiguous(),
            acc,
            top,
            total,
            keys.stride(0),
            keys.stride(1),
            keys.stride(2),
            scale,
            part,
            group,
            block_g,
            _BLOCK,
            dim,
            parts,
        )
        # The parts merged by their maxima, one program per (row, key head): a part past
        # the row's position read nothing (its maximum -inf) and weighs nothing.
        out = query.new_empty((rows, heads, dim))
        torch.library.wrap_triton(_merge_kernel)[(rows, kv_heads)](
            acc, top, total, out, group, block_g, dim, parts, triton.next_power_of_2(parts)
        )
        return out
