"""The static-cache settings: when an engine plans graphs for its steps."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni.static_decode import StaticDecodeArgs, StaticPlan


def test_a_plan_is_on_for_cuda_by_default_and_graphs_only_there() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 1)
    assert StaticPlan.of(StaticDecodeArgs(), cpu, 8) is None
    assert StaticPlan.of(StaticDecodeArgs(), cuda, 8) == StaticPlan(8, 4096, True, warm=True)
    cold = StaticDecodeArgs(warm_graphs=False)
    assert StaticPlan.of(cold, cuda, 8) == StaticPlan(8, 4096, graphs=True, warm=False)
    forced = StaticDecodeArgs(static_cache=True, max_context=64)
    assert StaticPlan.of(forced, cpu, 2) == StaticPlan(2, 64, graphs=False)
    assert StaticPlan.of(StaticDecodeArgs(static_cache=False), cuda, 8) is None
    # What the engines ask of it when they load: graphs on a GPU unless turned off.
    assert StaticDecodeArgs().graphs_on(cuda)
    assert not StaticDecodeArgs().graphs_on(cpu)
    assert not forced.graphs_on(cpu)
    assert not StaticDecodeArgs(static_cache=False).graphs_on(cuda)


def _reference(query, key, value, mask, scaling):  # type: ignore[no-untyped-def]
    """Plain attention, each query head over its key head's positions, in float64."""
    heads, kv_heads = query.shape[1], key.shape[1]
    key = key.double().repeat_interleave(heads // kv_heads, dim=1)
    value = value.double().repeat_interleave(heads // kv_heads, dim=1)
    scores = query.double() @ key.transpose(-2, -1) * scaling
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value


@pytest.mark.parametrize("batch", [1, 3, 40])
def test_grouped_decode_attention_equals_plain_attention_on_either_path(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omni_actors.actors.engines.qwen3_omni import static_decode

    generator = torch.Generator().manual_seed(batch)
    heads, kv_heads, span, dim = 8, 2, 12, 16
    query = torch.randn(batch, heads, 1, dim, generator=generator)
    key = torch.randn(batch, kv_heads, span, dim, generator=generator)
    value = torch.randn(batch, kv_heads, span, dim, generator=generator)
    positions = torch.randint(0, span, (batch,), generator=generator)
    positions[0] = 0  # a row that sees its first position alone
    mask = (torch.arange(span)[None] <= positions[:, None])[:, None, None, :]
    expected = _reference(query, key, value, mask, 0.3).float()
    seen = []
    matmul = static_decode.matmul_attention

    def spy(*args):  # type: ignore[no-untyped-def]
        seen.append("matmul")
        return matmul(*args)

    monkeypatch.setattr(static_decode, "matmul_attention", spy)
    # Below the threshold (the default's side for these rows) the two products run;
    # at threshold 0 the fused kernel does: both compute the same attention.
    for threshold, path in ((batch * kv_heads + 1, ["matmul"]), (0, [])):
        seen.clear()
        monkeypatch.setattr(static_decode, "FUSED_MIN_BLOCKS", threshold)
        out = static_decode.grouped_attention_of(query, key, value, mask, 0.3)
        assert seen == path
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # The default sends few rows to the products and many to the fused kernel.
    monkeypatch.undo()
    assert (batch * kv_heads < static_decode.FUSED_MIN_BLOCKS) == (batch < 32)
