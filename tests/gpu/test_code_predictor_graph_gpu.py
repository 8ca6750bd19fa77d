"""The talker's code predictor replayed from CUDA graphs gives the eager frame's codes
and carry bit for bit, for every batch size, and a talker on CUDA uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_actors.actors.engines.qwen3_omni import configs, stepping, weights
from omni_actors.actors.engines.qwen3_omni.code_predictor_graph import GraphedCodePredictor
from omni_actors.actors.engines.qwen3_omni.talker_model import TalkerModel
from omni_actors.models.cache import prepare

DEVICE = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def talker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare("tiny-omni", cache_dir=tmp_path_factory.mktemp("weights"))


def test_graphed_frames_equal_eager_frames_for_every_batch(talker_dir: Path) -> None:
    torch.cuda.set_device(DEVICE)
    talker = weights.load(talker_dir, "talker", device=DEVICE)
    graphed = GraphedCodePredictor.of_talker(talker)
    width = int(talker.config.text_config.hidden_size)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for batch in (1, 3, 1, 2, 3):
        hidden = torch.randn(batch, 1, width, device=DEVICE, generator=gen)
        code0 = torch.randint(0, configs.CODEBOOK_SIZE, (batch, 1), device=DEVICE, generator=gen)
        eager = stepping.code_predictor_frame(talker, hidden, code0)
        replayed = graphed(hidden, code0)
        assert torch.equal(replayed[0], eager[0]), batch
        assert torch.equal(replayed[1], eager[1]), batch
    assert graphed.graphed == [1, 2, 3]
    assert graphed.eager_steps == 0
    # Outputs are a frame's own: a later replay does not change an earlier frame's codes.
    first = graphed(hidden[:1], code0[:1])
    kept = first[0].clone()
    graphed(torch.randn_like(hidden[:1]), code0[:1])
    assert torch.equal(first[0], kept)


def test_a_talker_on_cuda_captures_its_first_batch_at_load(talker_dir: Path) -> None:
    torch.cuda.set_device(DEVICE)
    model = TalkerModel(talker_dir, DEVICE, stop_at_codec_eos=False)
    assert isinstance(model._code_frame, GraphedCodePredictor)
    assert model._code_frame.graphed == [1]
