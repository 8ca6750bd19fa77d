"""code2wav's faster forward: the left context it skips and the activation it computes in
place leave the emitted samples as HF's, and anything unknown is refused at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni import weights
from omni_actors.actors.engines.qwen3_omni.code2wav_model import Code2WavModel
from omni_actors.actors.engines.qwen3_omni.code2wav_reach import decoder_reach
from omni_actors.actors.engines.qwen3_omni.code2wav_snake import (
    InPlaceSnakeBeta,
    replace_snake_activations,
)
from omni_actors.actors.engines.qwen3_omni.hf import Qwen3OmniMoeSnakeBeta
from omni_actors.models.cache import prepare


@pytest.fixture(scope="module")
def stage_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache_dir = tmp_path_factory.mktemp("code2wav-layers")
    prepare("tiny-omni", cache_dir=cache_dir)
    return cache_dir / "tiny-omni" / "seed-0"


def codes(model: Code2WavModel, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.codebook, (1, model.quantizers, frames), generator=gen)


@pytest.mark.integration
def test_context_beyond_the_reach_is_skipped_and_context_within_it_is_not(stage_dir: Path) -> None:
    model = Code2WavModel(stage_dir)
    assert model.reach_frames == 4  # 14 samples at 4 per frame before the decoder blocks
    window = codes(model, 50, seed=1)
    emit = 25 * model.per_frame - model.pending  # a steady window: 25 context, 25 new
    full = model._forward(window, 0)[0, emit:]
    ((skipped, _),) = model.decode(window, [emit])
    assert skipped.shape[-1] == full.shape[-1] - model.pending
    assert torch.allclose(skipped, full[: -model.pending], atol=1e-6, rtol=0)
    # One frame less than the reach changes the emitted samples: the reach is not loose.
    short = model._forward(window, 25 - model.reach_frames + 1)[0]
    assert not torch.allclose(short[-full.shape[-1] :], full, atol=1e-4, rtol=0)


@pytest.mark.integration
def test_in_place_snake_is_bit_for_bit_hf(stage_dir: Path) -> None:
    hf: Any = weights.load(stage_dir, "code2wav")
    snakes = [m for m in hf.modules() if isinstance(m, Qwen3OmniMoeSnakeBeta)]
    gen = torch.Generator().manual_seed(2)
    for snake in snakes:
        with torch.no_grad():
            snake.alpha.normal_(generator=gen)  # not the prepared values: every factor matters
            snake.beta.normal_(generator=gen)
            hidden = torch.randn(2, snake.in_features, 300, generator=gen)
            assert torch.equal(InPlaceSnakeBeta(snake)(hidden), snake(hidden))
    assert replace_snake_activations(hf) == len(snakes)
    assert not any(isinstance(m, Qwen3OmniMoeSnakeBeta) for m in hf.modules())


@pytest.mark.integration
def test_an_unknown_decoder_layer_is_refused(stage_dir: Path) -> None:
    hf: Any = weights.load(stage_dir, "code2wav")
    assert decoder_reach(list(hf.decoder)[1:]) == 14
    with pytest.raises(RuntimeError, match="Identity is unknown"):
        decoder_reach([*list(hf.decoder)[1:], torch.nn.Identity()])
