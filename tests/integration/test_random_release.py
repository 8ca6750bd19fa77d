"""Releases of seeded random weights: the real release's shapes and layout, any size.

The full-size release is what GPU tests and benches load; here its config is checked on
the ``meta`` device (no memory), and the writer runs on tiny-omni's config, whose release
every stage must load as it loads the prepared one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni import configs, weights
from omni_actors.actors.engines.qwen3_omni.random_release import (
    real_config,
    release_vocab,
    write_random_release,
)
from omni_actors.actors.engines.qwen3_omni.tokenizer import write_tokenizer
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.models.release import INDEX, Release

pytestmark = pytest.mark.integration


def _stage_bytes(config: dict[str, Any], stage: str) -> int:
    part = weights.stage_config_of(config, stage, Path("config.json"))
    with configs.quiet_transformers(), torch.device("meta"):
        model = weights.STAGE_CLASSES[stage]._from_config(part, dtype=torch.bfloat16)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def test_the_real_config_makes_the_published_sizes_and_ids() -> None:
    config = real_config()
    gib = {stage: _stage_bytes(config, stage) / 2**30 for stage in weights.STAGES}
    assert round(gib["thinker"], 1) == 59.1
    assert round(gib["talker"], 1) == 6.2
    assert round(gib["code2wav"], 1) == 0.4
    talker, thinker = config["talker_config"], config["thinker_config"]
    assert talker["accept_hidden_layer"] == 24
    assert talker["speaker_id"] == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    assert talker["text_config"]["num_experts_per_tok"] == 6
    assert thinker["audio_config"]["n_window"] == 50
    assert thinker["audio_config"]["output_dim"] == 2048
    assert (config["im_start_token_id"], config["im_end_token_id"]) == (151644, 151645)
    assert thinker["audio_token_id"] == 151675


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("random") / "release"
    config = weights.release_config(configs.tiny_configs(0))
    return write_random_release(out, config, seed=3, device="cpu", max_shard_bytes=1_000_000)


def test_a_random_release_has_the_layout_and_every_stage_loads(release: Path) -> None:
    index = json.loads((release / INDEX).read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) > 2
    assert {n for n, f in index.items() if f == shards[-1]} == {
        n for n in index if n.startswith("code2wav.")
    }
    assert json.loads((release / "config.json").read_text())["dtype"] == "bfloat16"
    for stage in weights.STAGES:
        model = weights.load(release, stage)
        tensors = model.state_dict()
        assert all(t.dtype == torch.bfloat16 for t in tensors.values() if t.is_floating_point())
        assert all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point())
    norm = "thinker.model.layers.0.input_layernorm.weight"
    loaded = dict(Release.open(release).tensors("thinker.", strip=False))
    assert torch.equal(loaded[norm], torch.ones_like(loaded[norm]))
    expert = loaded["thinker.model.layers.0.mlp.experts.1.up_proj.weight"]
    assert 0.01 < float(expert.float().std()) < 0.03


def test_a_tensor_depends_on_its_seed_and_name_only(release: Path, tmp_path: Path) -> None:
    config = weights.release_config(configs.tiny_configs(0))
    # Other shards, and the talker alone (what a machine too small for the release writes).
    again = write_random_release(
        tmp_path / "again", config, seed=3, device="cpu", stages=("talker",)
    )
    index = json.loads((again / INDEX).read_text())["weight_map"]
    assert {name.split(".")[0] for name in index} == {"talker"}
    other = write_random_release(tmp_path / "other", config, seed=4, device="cpu")
    first = dict(Release.open(release).tensors("talker.", strip=False))
    assert first.keys() == dict(Release.open(again).tensors("talker.", strip=False)).keys()
    same = dict(Release.open(again).tensors("talker.", strip=False))
    assert all(torch.equal(first[k], same[k]) for k in first)
    differ = dict(Release.open(other).tensors("talker.", strip=False))
    assert any(not torch.equal(first[k], differ[k]) for k in first)


def test_the_full_size_release_tokenizer_has_qwen_ids(tmp_path: Path) -> None:
    config = real_config()
    write_tokenizer(tmp_path, release_vocab(config))
    (tmp_path / "config.json").write_text(json.dumps(config))
    vocabulary = Vocabulary.load(tmp_path)  # cross-checks every id the config names
    assert vocabulary.user_opening[:2] == (151644, 872)
    assert vocabulary.assistant_opening[:2] == (151644, 77091)
    assert vocabulary.close_turn[0] == 151645


def test_a_random_release_of_tiny_omni_config_has_a_tokenizer_the_thinker_reads(
    release: Path,
) -> None:
    vocabulary = Vocabulary.load(release)
    tiny = configs.tiny_configs(0)
    assert vocabulary.user_opening[:2] == (tiny.im_start_token_id, tiny.user_token_id)
