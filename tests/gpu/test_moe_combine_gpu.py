"""The MoE experts' Triton combine (``moe_combine="triton"``) on a CUDA device: the sum
the gather and ``bmm`` give, alone, in the lean forward, from a CUDA graph and compiled
by inductor, as the engines' compiled layers and graphs run it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

from omni_actors.actors.engines.qwen3_omni import moe, moe_combine  # noqa: E402
from omni_actors.actors.engines.qwen3_omni.frame_compile import end_compile_workers  # noqa: E402
from omni_actors.actors.engines.qwen3_omni.moe import experts_forward  # noqa: E402

EXPERTS, TOP_K, HIDDEN, INTERMEDIATE = 16, 4, 320, 64


def _routing(tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(tokens)
    draw = lambda *shape: torch.randn(shape, generator=generator)  # noqa: E731
    gate_up = (draw(EXPERTS, 2 * INTERMEDIATE, HIDDEN) * 0.1).to("cuda", dtype)
    down = (draw(EXPERTS, HIDDEN, INTERMEDIATE) * 0.1).to("cuda", dtype)
    hidden = draw(tokens, HIDDEN).to("cuda", dtype)
    weights, index = torch.softmax(draw(tokens, EXPERTS), -1).topk(TOP_K, dim=-1)
    return gate_up, down, hidden, index.cuda(), weights.to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_sums_each_tokens_rows_as_the_gather_and_bmm(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    tokens = 300
    rows = torch.randn(tokens * TOP_K, HIDDEN, generator=generator).to("cuda", dtype)
    inverse = torch.randperm(tokens * TOP_K, generator=generator).cuda()
    weights = torch.rand(tokens, TOP_K, generator=generator).to("cuda", dtype)
    assert moe_combine.serves(rows, tokens)
    got = moe_combine.combine(rows, inverse, weights)
    want = moe._combine(rows, inverse, weights)
    assert got.dtype == want.dtype
    assert got.shape == (tokens, HIDDEN)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("tokens", [1, 200])
def test_the_lean_forward_with_it_replays_and_compiles_to_the_same_sum(tokens: int) -> None:
    """Below its fewest tokens the gather runs; from them the kernel, in a graph and
    compiled, each equal to the gather's forward to bfloat16 rounding."""
    gate_up, down, hidden, index, weights = _routing(tokens, torch.bfloat16)
    act = torch.nn.functional.silu

    def forward(combine: moe.MoeCombine) -> torch.Tensor:
        return experts_forward(gate_up, down, act, hidden, index, weights, combine)

    want = forward("gather")
    eager = forward("triton")
    torch.testing.assert_close(eager, want, rtol=2e-2, atol=2e-2)
    if tokens < moe_combine.MIN_TOKENS:
        assert torch.equal(eager, want)  # the gather itself
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward("triton")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forward("triton")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    compiled = torch.compile(forward, backend="inductor", fullgraph=True)
    try:
        torch.testing.assert_close(compiled("triton"), eager, rtol=2e-2, atol=2e-2)
    finally:
        end_compile_workers()  # inductor's pool would outlive the test
