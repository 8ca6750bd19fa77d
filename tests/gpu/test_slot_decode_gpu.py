"""On CUDA in bfloat16, at the thinker's head sizes, decode rows read in place
(``decode_attention="triton"``) attend as the gathered copy does, eagerly and replayed
from a CUDA graph whose rows' positions change between replays."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from omni_actors.actors.engines.qwen3_omni.frame_compile import end_compile_workers  # noqa: E402
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


def _inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's query, key and value rows, drawn before any capture (a generator cannot
    be made during one)."""
    generator = torch.Generator(device="cuda:0").manual_seed(2)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device="cuda:0", dtype=torch.bfloat16)

    return draw(rows, HEADS, DIM), draw(1, KV_HEADS, rows, DIM), draw(1, KV_HEADS, rows, DIM)


def _step(
    cache: SlotCache,
    slots: torch.Tensor,
    starts: torch.Tensor,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    query, key, value = inputs
    step = cache.decode_step(slots, starts, span=MAX_LEN)
    keys, values = step.update(key, value, 0)
    with step.active([]):
        out, _ = _slot_attention(
            torch.nn.Module(), query.transpose(0, 1)[None], keys, values, step.mask, DIM**-0.5
        )
    result: torch.Tensor = out[0]
    return result


@pytest.mark.parametrize(
    "positions",
    [[0, 1, 511, 512, 1000, 2600, 4000, 4095], [2600]],
    ids=["eight_rows", "one_row_short_parts"],
)
def test_rows_read_in_place_attend_as_the_gathered_copy_eager_and_replayed(
    positions: list[int],
) -> None:
    gather, in_place = _cache("gather"), _cache("triton")
    assert in_place.in_place
    slots = torch.arange(len(positions), device="cuda:0")
    starts = torch.tensor(positions, device="cuda:0")
    inputs = _inputs(len(positions))
    want = _step(gather, slots, starts, inputs)
    got = _step(in_place, slots, starts, inputs)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)

    static_starts = starts.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _step(in_place, slots, static_starts, inputs)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = _step(in_place, slots, static_starts, inputs)
    for moved in (starts, starts.flip(0), torch.full_like(starts, 3000)):
        static_starts.copy_(moved)
        graph.replay()
        torch.cuda.synchronize()
        expected = _step(gather, slots, moved, inputs)
        torch.testing.assert_close(replayed, expected, rtol=2e-2, atol=2e-2)


def test_a_compiled_caller_runs_the_kernel_as_eager_does() -> None:
    """Inductor passes the scale as a float64: the kernel keeps its scores float32 (it
    failed to compile before)."""
    from omni_actors.actors.engines.qwen3_omni import slot_decode

    in_place = _cache("triton")
    slots = torch.arange(4, device="cuda:0")
    starts = torch.tensor([5, 700, 2600, 4095], device="cuda:0")
    query = _inputs(4)[0]
    keys, values = in_place.keys[0], in_place.values[0]

    def attend(query: torch.Tensor) -> torch.Tensor:
        return slot_decode.attend(query * 1.0, keys, values, slots, starts, DIM**-0.5, MAX_LEN)

    eager = attend(query)
    try:
        compiled = torch.compile(attend, fullgraph=True)(query)
    finally:
        end_compile_workers()  # inductor's pool would outlive the test
    torch.testing.assert_close(compiled, eager, rtol=1e-2, atol=1e-2)
