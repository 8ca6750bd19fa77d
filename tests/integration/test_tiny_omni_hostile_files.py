"""A prepared tiny-omni whose files were damaged or swapped is refused, the file named.

Each test damages a copy of the prepared model in its own ``tmp_path`` (the module's
prepared cache is never touched): the model cache's check (``require``, ``prepare``, the
``omni-actors prepare`` command) and the stage loader (``weights.load``) must each stop
with a ``ModelFileError`` naming the file and saying how to rebuild, and weights in a
pickle-based format must never be loaded.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
from safetensors.torch import load_file

from omni_actors.actors.engines.tiny_omni import layout, weights
from omni_actors.actors.engines.tiny_omni.thinker_model import ThinkerModel
from omni_actors.cli import main
from omni_actors.errors import ModelFileError
from omni_actors.models.cache import model_dir, prepare, require

pytestmark = pytest.mark.integration

Damage = Callable[[Path], None]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("model-cache")
    prepare("tiny-omni", cache_dir=cache)
    return cache


@pytest.fixture
def cache(prepared: Path, tmp_path: Path) -> Path:
    """A copy of the prepared cache, this test's to damage."""
    copy = tmp_path / "cache"
    shutil.copytree(prepared, copy)
    return copy


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _noise(path: Path) -> None:
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))


def _lying_header(path: Path) -> None:
    """The same tensor data under a header that claims a bigger first tensor."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    first = next(name for name in sorted(header) if name != "__metadata__")
    header[first]["shape"] = [2 * n for n in header[first]["shape"]]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length :])


def _garble_vocab(path: Path) -> None:
    tokenizer = json.loads(path.read_text())
    tokenizer["model"]["vocab"] = [1, "two", None]
    path.write_text(json.dumps(tokenizer))


def _pickle_weights(path: Path) -> None:
    """Swap ``model.safetensors`` for the same tensors as a torch pickle, which
    transformers would load by itself if it looked for one."""
    torch.save(load_file(path), path.with_name("pytorch_model.bin"))
    path.unlink()


DAMAGES: list[tuple[str, Damage]] = [
    ("thinker/model.safetensors", _cut),
    ("talker/model.safetensors", _lying_header),
    ("code2wav/model.safetensors", _noise),
    ("checkpoint/model.safetensors", _empty),
    ("code2wav/model.safetensors", Path.unlink),
    ("config.json", _cut),
    ("talker/config.json", _noise),
    ("thinker/generation_config.json", _empty),
    ("tokenizer.json", _cut),
    ("thinker/tokenizer.json", _garble_vocab),
    ("checkpoint/tokenizer_config.json", _noise),
]


def test_an_intact_copy_passes(cache: Path) -> None:
    assert require("tiny-omni", cache_dir=cache) == model_dir("tiny-omni", cache_dir=cache)


@pytest.mark.parametrize(
    ("name", "damage"), DAMAGES, ids=[f"{n}-{d.__name__.strip('_')}" for n, d in DAMAGES]
)
def test_a_damaged_cache_file_is_named_with_the_rebuild_command(
    cache: Path, name: str, damage: Damage
) -> None:
    where = model_dir("tiny-omni", cache_dir=cache)
    damage(where / name)
    for use in (require, prepare):
        with pytest.raises(ModelFileError) as info:
            use("tiny-omni", cache_dir=cache)
        assert info.value.path == where / name
        assert str(where / name) in str(info.value)
        assert f"omni-actors prepare tiny-omni --cache-dir {cache} --force" in str(info.value)


def test_the_prepare_command_reports_a_damaged_cache(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = model_dir("tiny-omni", cache_dir=cache) / "thinker" / "model.safetensors"
    _cut(damaged)
    assert main(["prepare", "tiny-omni", "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert str(damaged) in err
    assert "--force" in err
    assert "Traceback" not in err


def test_weights_only_in_a_pickle_format_are_never_loaded(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = model_dir("tiny-omni", cache_dir=cache)
    stage = where / "code2wav"
    _pickle_weights(stage / "model.safetensors")
    for refuse in (lambda: require("tiny-omni", cache_dir=cache), lambda: weights.load(stage)):
        with pytest.raises(ModelFileError, match=r"pytorch_model\.bin") as info:
            refuse()
        assert info.value.path == stage
    # Past the directory check, transformers itself is told safetensors only.
    monkeypatch.setattr(weights, "safetensors_weights", lambda *args, **kwargs: [])
    with pytest.raises(ModelFileError) as info:
        weights.load(stage)
    assert "model.safetensors" in str(info.value)


@pytest.mark.parametrize("damage", [_cut, _empty, _noise, _lying_header])
def test_a_damaged_stage_weights_file_is_named_when_loading(cache: Path, damage: Damage) -> None:
    stage = model_dir("tiny-omni", cache_dir=cache) / "code2wav"
    damage(stage / "model.safetensors")
    with pytest.raises(ModelFileError, match="no valid safetensors") as info:
        weights.load(stage)
    assert info.value.path == stage / "model.safetensors"
    assert layout.REBUILD in str(info.value)


def _config(**fields: object) -> Damage:
    def damage(path: Path) -> None:
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    return damage


@pytest.mark.parametrize(
    ("damage", "blamed", "problem"),
    [
        (_cut, "config.json", "no valid JSON"),
        (_noise, "config.json", "no valid JSON"),
        (lambda path: path.write_text("[1, 2]"), "config.json", "JSON list"),
        (_config(architectures=["SomethingElse"]), "config.json", "not a tiny-omni stage"),
        (_config(architectures="Qwen3OmniMoeCode2Wav"), "config.json", "not a tiny-omni stage"),
        (_config(hidden_size="wide"), "config.json", "no valid Qwen3OmniMoeCode2WavConfig"),
        (_config(hidden_size=-4), "", "weights do not build the model"),
        (_config(hidden_size=128), "", "weights do not build the model"),
    ],
)
def test_a_damaged_stage_config_is_named_when_loading(
    cache: Path, damage: Damage, blamed: str, problem: str
) -> None:
    stage = model_dir("tiny-omni", cache_dir=cache) / "code2wav"
    damage(stage / "config.json")
    with pytest.raises(ModelFileError, match=problem) as info:
        weights.load(stage)
    assert info.value.path == stage / blamed
    assert layout.REBUILD in str(info.value)


@pytest.mark.parametrize(
    "damage", [_cut, _config(talker_config={}), _config(talker_config={"accept_hidden_layer": "1"})]
)
def test_a_damaged_composite_config_is_named_by_the_thinker(cache: Path, damage: Damage) -> None:
    where = model_dir("tiny-omni", cache_dir=cache)
    damage(where / "config.json")
    with pytest.raises(ModelFileError) as info:
        ThinkerModel(where / "thinker")
    assert info.value.path == where / "config.json"
