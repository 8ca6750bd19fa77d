"""On CUDA in bfloat16, at the thinker's head sizes, the slot cache's attention runs
PyTorch's fused kernels, not its math kernel (keys repeated per query head, float32
scores): for decode rows (a decode step, and rows beside a prefill chunk) and for a
prefill chunk that starts mid-slot. Its output equals the math kernel's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from omni_actors.actors.engines.qwen3_omni.slot_cache import (  # noqa: E402
    Segment,
    SlotCache,
    SlotStep,
    _slot_attention,
)

HEADS, KV_HEADS, DIM, MAX_LEN = 32, 4, 128, 1024
MATH = "aten::_scaled_dot_product_attention_math"


def _cache() -> SlotCache:
    config = SimpleNamespace(
        num_hidden_layers=1,
        num_key_value_heads=KV_HEADS,
        head_dim=DIM,
        hidden_size=HEADS * DIM,
        num_attention_heads=HEADS,
    )
    device = torch.device("cuda:0")
    cache = SlotCache(config, slots=4, max_len=MAX_LEN, device=device, dtype=torch.bfloat16)
    generator = torch.Generator(device=device).manual_seed(1)
    for tensor in (cache.keys[0], cache.values[0]):
        tensor.copy_(torch.randn(tensor.shape, generator=generator, device=device))
    return cache


def _attend(step: SlotStep, tokens: int) -> tuple[torch.Tensor, set[str]]:
    generator = torch.Generator(device="cuda:0").manual_seed(2)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device="cuda:0", dtype=torch.bfloat16)

    query = draw(tokens, HEADS, DIM)
    key, value = draw(1, KV_HEADS, tokens, DIM), draw(1, KV_HEADS, tokens, DIM)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        keys, values = step.update(key, value, 0)
        with step.active([]):
            out, _ = _slot_attention(
                torch.nn.Module(), query.transpose(0, 1)[None], keys, values, step.mask, DIM**-0.5
            )
        torch.cuda.synchronize()
    return out[0], {event.name for event in prof.events()}


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_slot_attention_runs_fused_kernels_on_cuda(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omni_actors.actors.engines.qwen3_omni import static_decode

    # Decode rows on the fused kernel however few (by default few rows take two matrix
    # products, which run no attention kernel at all: checked at the end).
    monkeypatch.setattr(static_decode, "FUSED_MIN_BLOCKS", 0)
    cache = _cache()
    if kind == "decode":
        slots = torch.tensor([2, 0, 3], device="cuda:0")
        starts = torch.tensor([5, 300, 700], device="cuda:0")
        step = cache.decode_step(slots, starts, span=MAX_LEN)
        tokens = 3
    else:
        segments = [
            Segment(slot=0, start=300, length=200),  # a later chunk over the history
            Segment(slot=1, start=20, length=1),  # a decode row beside it
            Segment(slot=2, start=0, length=64),  # a prompt's first chunk
        ]
        step = cache.step(segments)
        tokens = sum(seg.length for seg in segments)
    out, ops = _attend(step, tokens)
    assert "aten::scaled_dot_product_attention" in ops
    assert MATH not in ops, sorted(op for op in ops if "attention" in op)
    with sdpa_kernel(SDPBackend.MATH):
        math, ops = _attend(step, tokens)
    assert MATH in ops  # the profile sees the math kernel where it runs
    torch.testing.assert_close(out.float(), math.float(), atol=2e-2, rtol=2e-2)
    monkeypatch.undo()
    products, ops = _attend(step, tokens)
    assert MATH not in ops
    torch.testing.assert_close(products.float(), math.float(), atol=2e-2, rtol=2e-2)
