"""On CUDA in bfloat16, at the thinker's head sizes, decode rows read in place
(``decode_attention="triton"``) attend as the gathered copy does, eagerly and replayed
from a CUDA graph whose rows' positions change between replays."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from omni_actors.actors.engines.qwen3_omni.slot_cache import (  # noqa: E402
    SlotCache,
    _slot_attention,
)

HEADS, KV_HEADS, DIM, MAX_LEN, SLOTS = 32, 4, 128, 4096, 8


def _cache(attention: str) -> SlotCache:
    config = SimpleNamespace(
        num_hidden_layers=1,
        num_key_value_heads=KV_HEADS,
        head_dim=DIM,
        hidden_size=HEADS * DIM,
        num_attention_heads=HEADS,
    )
    device = torch.device("cuda:0")
    cache = SlotCache(
        config,
        slots=SLOTS,
        max_len=MAX_LEN,
        device=device,
        dtype=torch.bfloat16,
        decode_attention=attention,  # type: ignore[arg-type]
    )
    generator = torch.Generator(device=device).manual_seed(1)
    for tensor in (cache.keys[0], cache.values[0]):
        tensor.copy_(torch.randn(tensor.shape, generator=generator, device=device))
    return cache


def _step(cache: SlotCache, slots: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator(device="cuda:0").manual_seed(2)
    rows = slots.shape[0]

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device="cuda:0", dtype=torch.bfloat16)

    query = draw(rows, HEADS, DIM)
    key, value = draw(1, KV_HEADS, rows, DIM), draw(1, KV_HEADS, rows, DIM)
    step = cache.decode_step(slots, starts, span=MAX_LEN)
    keys, values = step.update(key, value, 0)
    with step.active([]):
        out, _ = _slot_attention(
            torch.nn.Module(), query.transpose(0, 1)[None], keys, values, step.mask, DIM**-0.5
        )
    result: torch.Tensor = out[0]
    return result


def test_rows_read_in_place_attend_as_the_gathered_copy_eager_and_replayed() -> None:
    gather, in_place = _cache("gather"), _cache("triton")
    assert in_place.in_place
    slots = torch.arange(SLOTS, device="cuda:0")
    starts = torch.tensor([0, 1, 511, 512, 1000, 2600, 4000, 4095], device="cuda:0")
    want = _step(gather, slots, starts)
    got = _step(in_place, slots, starts)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)

    static_starts = starts.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _step(in_place, slots, static_starts)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = _step(in_place, slots, static_starts)
    for moved in (starts, starts.flip(0), torch.full_like(starts, 3000)):
        static_starts.copy_(moved)
        graph.replay()
        torch.cuda.synchronize()
        expected = _step(gather, slots, moved)
        torch.testing.assert_close(replayed, expected, rtol=2e-2, atol=2e-2)
