"""The slot cache's in-place decode attention (a Triton kernel) against the gathered
attention it replaces: rows at the first position of their slot, at the last of the span,
across several parts of the span, and sharing a slot; then a cache that reads its rows
in place, in each kind of step that has them. On a GPU, or on a CPU through
Triton's interpreter (``TRITON_INTERPRET=1``); skipped where neither runs."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from omni_actors.actors.engines.qwen3_omni import slot_cache, slot_decode  # noqa: E402
from omni_actors.actors.engines.qwen3_omni.slot_cache import (  # noqa: E402
    Segment,
    _single_positions,
)

if torch.cuda.is_available():
    DEVICE, DTYPE = torch.device("cuda"), torch.bfloat16
elif os.environ.get("TRITON_INTERPRET") == "1":
    DEVICE, DTYPE = torch.device("cpu"), torch.float32
else:
    pytest.skip("Triton runs on a GPU or in its interpreter", allow_module_level=True)

HEADS, KV_HEADS, DIM, SLOTS, MAX_LEN = 8, 2, 16, 4, 1200


def _gathered(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    span: int,
) -> torch.Tensor:
    """What a decode step computes without the kernel: each row's slot span copied, then
    attended under the mask of its position."""
    mask = torch.arange(span, device=DEVICE)[None, None, None, :] <= starts[:, None, None, None]
    key = keys.index_select(0, slots)[:, :, :span]
    value = values.index_select(0, slots)[:, :, :span]
    return _single_positions(query, key, value, mask, DIM**-0.5)


def test_few_rows_split_their_span_into_short_parts() -> None:
    """Parts are multiples of the kernel's block, from one block (one row of four key
    heads over 4096 positions: 64 parts) to ``PART`` (32 rows: 8 parts)."""
    assert slot_decode._part(1, 4, 4096) == 64
    assert slot_decode._part(8, 4, 4096) == 256
    assert slot_decode._part(32, 4, 4096) == slot_decode.PART
    assert slot_decode._part(1, 4, 100) == 64
    assert slot_decode._part(3, 4, 4096) == 128


@pytest.mark.parametrize("programs", [1, 512], ids=["long_parts", "short_parts"])
@pytest.mark.parametrize("span", [256, 1024])
def test_each_row_attends_its_slot_up_to_its_position_as_the_gathered_attention(
    span: int, programs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slot_decode, "_PROGRAMS", programs)
    generator = torch.Generator().manual_seed(span)
    draw = lambda *shape: torch.randn(shape, generator=generator).to(DEVICE, DTYPE)  # noqa: E731
    keys, values = draw(SLOTS, KV_HEADS, MAX_LEN, DIM), draw(SLOTS, KV_HEADS, MAX_LEN, DIM)
    # The first position, the span's last, one past a part, and two rows of one slot.
    starts = torch.tensor([0, span - 1, min(slot_decode.PART, span - 1), 5, 100], device=DEVICE)
    slots = torch.tensor([2, 0, 3, 1, 1], device=DEVICE)
    query = draw(5, HEADS, DIM)
    got = slot_decode.attend(query, keys, values, slots, starts, DIM**-0.5, span)
    assert got.shape == query.shape
    assert got.dtype == DTYPE
    want = _gathered(query, keys, values, slots, starts, span)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if DEVICE.type == "cuda" else {}
    torch.testing.assert_close(got, want, **tolerance)
    # Positions past a row's own are never read: changing them changes nothing.
    keys[2, :, 1:] = 1e4
    values[2, :, 1:] = -1e4
    again = slot_decode.attend(query, keys, values, slots, starts, DIM**-0.5, span)
    torch.testing.assert_close(again[0], got[0])


def _cache(attention: str) -> slot_cache.SlotCache:
    config = SimpleNamespace(
        num_hidden_layers=1,
        num_key_value_heads=KV_HEADS,
        head_dim=DIM,
        hidden_size=HEADS * DIM,
        num_attention_heads=HEADS,
    )
    cache = slot_cache.SlotCache(
        config,
        slots=SLOTS - 1,
        max_len=MAX_LEN,
        device=DEVICE,
        dtype=DTYPE,
        decode_attention=attention,  # type: ignore[arg-type]
    )
    generator = torch.Generator().manual_seed(3)
    for layer in (cache.keys[0], cache.values[0]):
        layer.copy_(torch.randn(layer.shape, generator=generator).to(DEVICE, DTYPE))
    return cache


def _attend(step: slot_cache.SlotStep, attention: Any, query: torch.Tensor) -> torch.Tensor:
    """``query`` [T, heads, dim] through ``step``: its keys and values written (drawn),
    then ``attention`` (the step's registered function); [T, heads, dim]."""
    generator = torch.Generator().manual_seed(4)
    tokens = query.shape[0]
    new = [torch.randn(1, KV_HEADS, tokens, DIM, generator=generator).to(DEVICE, DTYPE)]
    new.append(torch.randn(1, KV_HEADS, tokens, DIM, generator=generator).to(DEVICE, DTYPE))
    key, value = step.update(new[0], new[1], 0)
    with step.active([]):
        out, _ = attention(torch.nn.Module(), query.transpose(0, 1)[None], key, value, step.mask)
    result: torch.Tensor = out[0]
    return result


def test_a_cache_reads_rows_in_place_in_every_step_that_has_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``decode_attention="triton"``, a decode step, a step of chunks with decode rows
    beside them and a fresh step with rows after its runs attend as the gathering cache
    does: rows in place (the decode step passes their slots and positions, not a mask)."""
    generator = torch.Generator().manual_seed(5)
    gather, in_place = _cache("gather"), _cache("triton")
    assert in_place.in_place
    assert not gather.in_place
    calls: list[int] = []
    attend = slot_decode.attend

    def counted(query: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(query.shape[0])
        return attend(query, *args)

    monkeypatch.setattr(slot_decode, "attend", counted)
    slots, starts = (
        torch.tensor([2, 0, 1], device=DEVICE),
        torch.tensor([700, 3, 64], device=DEVICE),
    )
    steps = [
        (lambda c: c.decode_step(slots, starts, span=1024), slot_cache._slot_attention, 3),
        (
            lambda c: c.step([Segment(1, 0, 9), Segment(2, 700, 1), Segment(0, 30, 1)]),
            slot_cache._slot_attention,
            11,
        ),
        (
            lambda c: c.fresh_rows_step(slots[:1], 8, slots[1:], starts[1:]),
            slot_cache._fresh_rows_attention,
            10,
        ),
    ]
    for build, attention, tokens in steps:
        query = torch.randn(tokens, HEADS, DIM, generator=generator).to(DEVICE, DTYPE)
        fast = build(in_place)
        if attention is slot_cache._slot_attention and fast.decode_only:
            assert fast.mask.dtype == torch.long
        want = _attend(build(gather), attention, query)
        assert not calls
        got = _attend(fast, attention, query)
        assert calls.pop() in (2, 3)  # the step's decode rows, in place
        assert not calls
        tolerance = {"rtol": 2e-2, "atol": 2e-2} if DEVICE.type == "cuda" else {}
        torch.testing.assert_close(got, want, **tolerance)
