"""The lean experts forward of Qwen3-Omni's MoE layers against transformers' own (the
engines that run it: ``tests/integration/test_tiny_omni_moe.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch
from pydantic import ValidationError
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerTextConfig,
    Qwen3OmniMoeTextConfig,
)

from omni_actors.actors.engines.qwen3_omni import moe, moe_combine
from omni_actors.actors.engines.qwen3_omni.hf import (
    Qwen3OmniMoeTalkerTextExperts,
    Qwen3OmniMoeThinkerTextExperts,
)
from omni_actors.actors.engines.qwen3_omni.moe import LeanExperts, MoeArgs, install
from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs

EXPERTS, TOP_K, HIDDEN, INTERMEDIATE = 8, 2, 48, 24


def experts(
    implementation: str = "eager", dtype: torch.dtype = torch.float32
) -> Qwen3OmniMoeThinkerTextExperts:
    """A thinker experts module with random weights, run by transformers'
    ``implementation``."""
    config = Qwen3OmniMoeTextConfig(
        hidden_size=HIDDEN,
        moe_intermediate_size=INTERMEDIATE,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
    )
    config._experts_implementation = implementation
    generator = torch.Generator().manual_seed(0)
    module = Qwen3OmniMoeThinkerTextExperts(config)  # type: ignore[arg-type]  # the text config, as the model passes it
    with torch.no_grad():
        for param in (module.gate_up_proj, module.down_proj):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return module.to(dtype).requires_grad_(False)


def routing(
    tokens: int, seed: int, only: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states, top-k expert ids (distinct per token, as a router's ``topk`` picks)
    and their normalized weights; with ``only``, every token picks among those experts."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, HIDDEN, generator=generator)
    logits = torch.randn(tokens, EXPERTS, generator=generator)
    if only is not None:
        barred = torch.ones(EXPERTS, dtype=torch.bool)
        barred[only] = False
        logits[:, barred] = float("-inf")
    weights, index = torch.softmax(logits, dim=-1).topk(TOP_K, dim=-1)
    return hidden, index, weights / weights.sum(dim=-1, keepdim=True)


CASES = [
    pytest.param(1, None, id="one-token"),
    pytest.param(2, None, id="two-tokens"),
    pytest.param(5, None, id="five-tokens"),
    pytest.param(64, None, id="64-tokens"),
    pytest.param(37, [1, 4, 6], id="experts-without-tokens"),
    pytest.param(3, [0, 7], id="first-and-last-expert-only"),
]


@pytest.mark.parametrize(("tokens", "only"), CASES)
def test_fp32_equals_transformers_eager_and_grouped(tokens: int, only: list[int] | None) -> None:
    hidden, index, weights = routing(tokens, seed=tokens, only=only)
    reference = experts("eager")
    lean = LeanExperts(reference)(hidden, index, weights)
    assert lean.shape == (tokens, HIDDEN)
    assert lean.dtype == torch.float32
    torch.testing.assert_close(lean, reference(hidden, index, weights), rtol=1e-5, atol=1e-5)
    grouped = experts("grouped_mm")
    torch.testing.assert_close(lean, grouped(hidden, index, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("tokens", "only"), CASES)
def test_bf16_equals_transformers_to_rounding(tokens: int, only: list[int] | None) -> None:
    hidden, index, weights = routing(tokens, seed=tokens, only=only)
    exact = experts("eager")(hidden, index, weights)
    reference = experts("grouped_mm", torch.bfloat16)
    hidden, weights = hidden.bfloat16(), weights.bfloat16()
    lean = LeanExperts(reference)(hidden, index, weights)
    theirs = reference(hidden, index, weights)
    assert lean.dtype == torch.bfloat16
    # As close to transformers' as bf16 rounds, and no farther from the fp32 sum.
    torch.testing.assert_close(lean, theirs, rtol=1.6e-2, atol=2e-2)
    lean_error = (lean.float() - exact).abs().max()
    assert lean_error <= 1.5 * (theirs.float() - exact).abs().max() + 1e-3


def test_the_loop_without_the_grouped_kernel_gives_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference = experts("eager")
    for tokens, only in ((64, None), (37, [1, 4, 6])):
        hidden, index, weights = routing(tokens, seed=1, only=only)
        grouped = LeanExperts(reference)(hidden, index, weights)
        with monkeypatch.context() as patch:
            patch.setattr(moe, "_GROUPED_MM", None)
            looped = LeanExperts(reference)(hidden, index, weights)
        torch.testing.assert_close(looped, grouped, rtol=1e-6, atol=1e-6)


def test_expert_ids_past_a_byte_sort_as_wider_integers() -> None:
    """Ids are sorted as the narrowest integers that hold them: bytes up to 256 experts,
    wider past that."""
    config = Qwen3OmniMoeTextConfig(
        hidden_size=8, moe_intermediate_size=4, num_experts=300, num_experts_per_tok=2
    )
    config._experts_implementation = "eager"
    reference = Qwen3OmniMoeThinkerTextExperts(config)  # type: ignore[arg-type]  # as above
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for param in (reference.gate_up_proj, reference.down_proj):
            param.copy_(torch.randn(param.shape, generator=generator))
    hidden = torch.randn(16, 8, generator=generator)
    # 256 and 0 (299 and 43) share their low byte: sorted as bytes, they would mix.
    index = torch.tensor([[256, 255], [0, 299], [255, 256], [1, 43]] * 4)
    weights = torch.full((16, 2), 0.5)
    torch.testing.assert_close(
        LeanExperts(reference)(hidden, index, weights),
        reference(hidden, index, weights),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_traced_whole_the_same_sum(dtype: torch.dtype) -> None:
    """Compiled layers trace the experts' forward in one graph (the byte sort included)
    and get what it gives eager."""
    hidden, index, weights = routing(37, seed=3)
    hidden, weights = hidden.to(dtype), weights.to(dtype)
    lean = LeanExperts(experts("eager", dtype))
    eager = lean(hidden, index, weights)
    traced = torch.compile(lean, backend="aot_eager", fullgraph=True)(hidden, index, weights)
    assert traced.dtype == dtype
    torch.testing.assert_close(traced, eager, rtol=1e-6, atol=1e-6)


# The ops that wait for the device to tell the host a value or a size: ``.item()`` /
# ``.tolist()`` (``_local_scalar_dense``) and the ops whose output size is data.
SYNCING = {
    "_local_scalar_dense",
    "nonzero",
    "bincount",
    "unique_consecutive",
    "_unique2",
    "masked_select",
    "repeat_interleave",
}


class Ops(TorchDispatchMode):  # type: ignore[misc,no-untyped-call,unused-ignore]
    """The aten ops run under it, in order."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call,unused-ignore]
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("tokens", [1, 37])
def test_no_op_waits_for_the_device(tokens: int) -> None:
    """What a CUDA graph capture needs: no host sync, no data-dependent size (and fewer
    ops than transformers' grouped forward, which runs the same two grouped matmuls)."""
    hidden, index, weights = routing(tokens, seed=2, only=[0, 3, 5])
    reference = experts("grouped_mm")
    lean = LeanExperts(reference)
    with Ops() as ours:
        lean(hidden, index, weights)
    with Ops() as theirs:
        reference(hidden, index, weights)
    assert not SYNCING & set(ours.names), ours.names
    assert ours.names.count("_grouped_mm") == theirs.names.count("_grouped_mm") == 2
    assert len(ours.names) < len(theirs.names)


def test_install_swaps_the_experts_of_both_text_models_keeping_their_parameters() -> None:
    talker_config = Qwen3OmniMoeTalkerTextConfig(
        hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE, num_experts=EXPERTS
    )
    thinker_block = torch.nn.ModuleDict({"experts": experts("eager")})
    talker_block = torch.nn.ModuleDict(
        {"experts": Qwen3OmniMoeTalkerTextExperts(talker_config)}  # type: ignore[no-untyped-call,unused-ignore]
    )
    model = torch.nn.Sequential(thinker_block, talker_block, torch.nn.Linear(2, 2))
    before = model.state_dict(keep_vars=True)
    assert install(model) == 2
    assert isinstance(thinker_block["experts"], LeanExperts)
    assert isinstance(talker_block["experts"], LeanExperts)
    after = model.state_dict(keep_vars=True)
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)
    assert install(model) == 0  # already lean


def test_engines_run_lean_experts_unless_told_otherwise() -> None:
    assert MoeArgs().moe == "lean"
    assert ThinkerArgs().moe == "lean"
    assert TalkerArgs().moe == "lean"
    assert ThinkerArgs.model_validate({"moe": "transformers"}).moe == "transformers"
    with pytest.raises(ValidationError, match="moe"):
        TalkerArgs.model_validate({"moe": "fast"})


def test_the_triton_combine_falls_back_to_the_gather_where_it_does_not_serve() -> None:
    """``moe_combine="triton"`` on a CPU (or without Triton, or below its fewest tokens)
    computes the gather's sum; an engine's arg says which, ``gather`` unless told."""
    hidden, index, weights = routing(80, seed=4)
    reference = experts("eager")
    lean = LeanExperts(reference, combine="triton")
    assert not moe_combine.serves(hidden, 80)
    assert not moe_combine.serves(hidden.to("meta"), moe_combine.MIN_TOKENS)
    torch.testing.assert_close(
        lean(hidden, index, weights), LeanExperts(reference)(hidden, index, weights)
    )
    model = torch.nn.ModuleDict({"experts": experts("eager")})
    assert install(model, "triton") == 1
    assert isinstance(model["experts"], LeanExperts)
    assert model["experts"].combine == "triton"
    assert (
        MoeArgs().moe_combine == ThinkerArgs().moe_combine == TalkerArgs().moe_combine == "triton"
    )
    assert ThinkerArgs.model_validate({"moe_combine": "gather"}).moe_combine == "gather"
    with pytest.raises(ValidationError, match="moe_combine"):
        TalkerArgs.model_validate({"moe_combine": "fused"})
