"""The slot cache's attention against attention written out by hand: every segment kind
of a step (a prefill chunk at the start of its slot, a later chunk, decode rows beside
them, padding rows), a decode step, a fresh step of several runs, and one with decode
rows after its runs, with grouped key/value heads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from omni_actors.actors.engines.qwen3_omni.slot_cache import (  # noqa: E402
    FreshGraphs,
    Segment,
    SlotCache,
    SlotStep,
    _fresh_attention,
    _fresh_rows_attention,
    _slot_attention,
)

HEADS, KV_HEADS, DIM, MAX_LEN = 8, 2, 16, 64


CONFIG = SimpleNamespace(
    num_hidden_layers=1,
    num_key_value_heads=KV_HEADS,
    head_dim=DIM,
    hidden_size=HEADS * DIM,
    num_attention_heads=HEADS,
)


def _cache(slots: int = 4) -> SlotCache:
    cache = SlotCache(
        CONFIG,  # type: ignore[arg-type]
        slots=slots,
        max_len=MAX_LEN,
        device=torch.device("cpu"),
        dtype=torch.float64,
        decode_attention="gather",  # the hand-written attention is the gathered one
    )
    generator = torch.Generator().manual_seed(1)
    # What earlier steps left in the slots: a later chunk and a decode row read it.
    cache.keys[0].copy_(torch.randn(cache.keys[0].shape, generator=generator, dtype=torch.float64))
    cache.values[0].copy_(
        torch.randn(cache.values[0].shape, generator=generator, dtype=torch.float64)
    )
    return cache


def _by_hand(cache: SlotCache, segments: list[Segment], query: torch.Tensor) -> torch.Tensor:
    """[T, heads, dim]: token t of a segment at ``start`` of ``slot`` attends that slot's
    positions ``0 .. start + t``, query head h reading key/value head h // group."""
    group = HEADS // KV_HEADS
    rows = []
    token = 0
    for seg in segments:
        for t in range(seg.length):
            seen = seg.start + t + 1
            keys = cache.keys[0][seg.slot, :, :seen]  # [kv_heads, seen, dim]
            values = cache.values[0][seg.slot, :, :seen]
            heads = []
            for h in range(HEADS):
                q = query[token, h]
                scores = keys[h // group] @ q / DIM**0.5
                heads.append(torch.softmax(scores, dim=0) @ values[h // group])
            rows.append(torch.stack(heads))
            token += 1
    return torch.stack(rows)


def _run(
    step: SlotStep, query: torch.Tensor, new_kv: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    key, value = step.update(new_kv[0], new_kv[1], 0)
    with step.active([]):
        out, _ = _slot_attention(
            torch.nn.Module(),
            query.transpose(0, 1)[None],
            key,
            value,
            step.mask,
            scaling=DIM**-0.5,
        )
    return out[0]


def _inputs(tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    draw = lambda *shape: torch.randn(shape, generator=generator, dtype=torch.float64)  # noqa: E731
    return draw(tokens, HEADS, DIM), draw(1, KV_HEADS, tokens, DIM), draw(1, KV_HEADS, tokens, DIM)


def test_each_segment_of_a_mixed_step_attends_its_own_slot_causally() -> None:
    cache = _cache()
    segments = [
        Segment(slot=0, start=0, length=7),  # a prompt's first chunk
        Segment(slot=1, start=20, length=1),  # a decode row
        Segment(slot=2, start=9, length=5),  # a later chunk over the history
        Segment(slot=3, start=40, length=1),  # another decode row
    ]
    tokens = sum(seg.length for seg in segments)
    query, key, value = _inputs(tokens)
    step = cache.step(segments, rows=6)  # two padding rows at the scratch slot
    padded = tokens + 2
    query = torch.cat([query, query[-1:].expand(2, -1, -1)])
    key = torch.cat([key, key[:, :, -1:].expand(-1, -1, 2, -1)], dim=2)
    value = torch.cat([value, value[:, :, -1:].expand(-1, -1, 2, -1)], dim=2)
    out = _run(step, query, (key, value))
    assert out.shape == (padded, HEADS, DIM)
    expected = _by_hand(cache, segments, query[:tokens])
    torch.testing.assert_close(out[:tokens], expected)


def test_a_decode_step_built_from_tensors_attends_like_the_hand_written_one() -> None:
    cache = _cache()
    slots, starts = torch.tensor([2, 0, 3]), torch.tensor([5, 31, 12])
    query, key, value = _inputs(3)
    step = cache.decode_step(slots, starts, span=64)
    out = _run(step, query, (key, value))
    segments = [Segment(int(s), int(p), 1) for s, p in zip(slots, starts, strict=True)]
    torch.testing.assert_close(out, _by_hand(cache, segments, query))


def test_a_fresh_step_of_several_runs_attends_each_run_causally_in_its_slot() -> None:
    """Runs of one length from the start of their slots: each run's keys land in its slot,
    and each query attends its own run's positions up to its own, as the op a compiled
    layer calls does too."""
    cache = _cache()
    slots, length = torch.tensor([3, 0, 2]), 6
    query, key, value = _inputs(3 * length)
    step = cache.fresh_step(slots, length)
    written = step.update(key, value, 0)
    flat = query.transpose(0, 1)[None]  # [1, heads, T, dim]
    with step.active([]):
        out, _ = _fresh_attention(torch.nn.Module(), flat, *written, step.mask, DIM**-0.5)
    for n, slot in enumerate(slots.tolist()):
        run = slice(n * length, (n + 1) * length)
        torch.testing.assert_close(cache.keys[0][slot, :, :length], key[0][:, run])
    segments = [Segment(int(slot), 0, length) for slot in slots]
    expected = _by_hand(cache, segments, query)
    torch.testing.assert_close(out[0], expected)
    op = torch.ops.omni_actors.slot_fresh_attention(flat, key, value, step.mask, DIM**-0.5)
    torch.testing.assert_close(op[0], expected)


def test_decode_rows_after_a_fresh_steps_runs_attend_their_slots_as_a_decode_step() -> None:
    """Runs from the start of their slots, then single-position rows of other slots (and
    a padding row at the scratch slot): every key lands in its slot, each run attends
    its own positions causally and each row its slot up to its position, as the op a
    compiled layer calls does too."""
    cache = _cache()
    slots, length = torch.tensor([3, 0]), 6
    row_slots, row_starts = torch.tensor([1, 2, cache.scratch]), torch.tensor([20, 41, 0])
    tokens = 2 * length + 3
    query, key, value = _inputs(tokens)
    step = cache.fresh_rows_step(slots, length, row_slots, row_starts)
    written = step.update(key, value, 0)
    flat = query.transpose(0, 1)[None]  # [1, heads, T, dim]
    with step.active([]):
        out, _ = _fresh_rows_attention(torch.nn.Module(), flat, *written, step.mask, DIM**-0.5)
        op = torch.ops.omni_actors.slot_step_attention(query, *written, DIM**-0.5)
    torch.testing.assert_close(cache.keys[0][1, :, 20], key[0][:, 2 * length])
    torch.testing.assert_close(cache.values[0][2, :, 41], value[0][:, 2 * length + 1])
    segments = [Segment(3, 0, length), Segment(0, 0, length), Segment(1, 20, 1), Segment(2, 41, 1)]
    expected = _by_hand(cache, segments, query)
    torch.testing.assert_close(out[0, : tokens - 1], expected)
    torch.testing.assert_close(op[: tokens - 1], expected)
    with pytest.raises(ValueError, match="does not fit"):
        cache.fresh_rows_step(slots, MAX_LEN + 1, row_slots, row_starts)


def test_fresh_graphs_take_as_many_runs_of_a_length_as_a_step_holds() -> None:
    """A graph per (runs, length): up to ``batch`` runs, where that many of the bucket's
    shortest fit the step's budget; one run of every length whatever the budget."""

    def forward(embeds: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor]:
        return (embeds,)

    graphs = FreshGraphs("test", _cache(), 16, forward, batch=4, max_tokens=40)
    assert graphs.sizes == [16, 32, 48, 64]
    assert graphs.keys == [(1, 16), (2, 16), (3, 16), (4, 16), (1, 32), (2, 32), (1, 48), (1, 64)]
    assert FreshGraphs("test", _cache(), 32, forward).keys == [(1, 32), (1, 64)]
    with_rows = FreshGraphs("test", _cache(), 32, forward, rows=2)
    assert with_rows.keys == [(1, 32), (1, 64), (1, 32, 2), (1, 64, 2)]
    with pytest.raises(ValueError, match="prefill_batch"):
        FreshGraphs("test", _cache(), 32, forward, batch=0)
    with pytest.raises(ValueError, match="prefill_rows"):
        FreshGraphs("test", _cache(), 32, forward, rows=-1)


def test_rows_are_read_in_place_by_default_only_where_the_kernel_serves() -> None:
    """``triton`` is the engines' default; a cache whose kernel does not serve (a CPU
    without Triton's interpreter) gathers, and ``gather`` always does."""
    from omni_actors.actors.engines.qwen3_omni import slot_decode
    from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs
    from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs

    assert ThinkerArgs().decode_attention == "triton"
    assert TalkerArgs().decode_attention == "triton"
    common = dict(slots=2, max_len=MAX_LEN, device=torch.device("cpu"), dtype=torch.float32)
    default = SlotCache(CONFIG, **common)  # type: ignore[arg-type]
    assert default.in_place is slot_decode.serves(default.keys[0], HEADS)
    assert not SlotCache(CONFIG, **common, decode_attention="gather").in_place  # type: ignore[arg-type]
