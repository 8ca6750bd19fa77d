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

from omni_actors.actors.engines.qwen3_omni import layout, weights
from omni_actors.actors.engines.qwen3_omni.thinker_model import ThinkerModel
from omni_actors.cli import main
from omni_actors.errors import ModelFileError
from omni_actors.models.cache import model_dir, prepare, require
from omni_actors.models.release import INDEX

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


def _shards(where: Path) -> list[str]:
    return sorted(set(json.loads((where / INDEX).read_text())["weight_map"].values()))


def _pickle_release(where: Path) -> None:
    """Swap every shard and the index for the same tensors as one torch pickle, which
    transformers would load by itself if it looked for one."""
    tensors: dict[str, torch.Tensor] = {}
    for name in _shards(where):
        tensors.update(load_file(where / name))
        (where / name).unlink()
    (where / INDEX).unlink()
    torch.save(tensors, where / "pytorch_model.bin")


DAMAGES: list[tuple[str, Damage]] = [
    ("shard 1", _cut),
    ("shard 2", _lying_header),
    ("shard -1", _noise),
    ("shard 2", _empty),
    ("shard -1", Path.unlink),
    (INDEX, _cut),
    ("config.json", _cut),
    ("generation_config.json", _empty),
    ("preprocessor_config.json", _noise),
    ("tokenizer.json", _cut),
    ("tokenizer.json", _garble_vocab),
    ("tokenizer_config.json", _noise),
]


def _file(where: Path, name: str) -> Path:
    """``name``'s path in the release: ``shard N`` is its Nth shard (-1: the last)."""
    if name.startswith("shard "):
        return where / _shards(where)[int(name.split()[1]) - (int(name.split()[1]) > 0)]
    return where / name


def test_an_intact_copy_passes(cache: Path) -> None:
    assert require("tiny-omni", cache_dir=cache) == model_dir("tiny-omni", cache_dir=cache)


@pytest.mark.parametrize(
    ("name", "damage"), DAMAGES, ids=[f"{n}-{d.__name__.strip('_')}" for n, d in DAMAGES]
)
def test_a_damaged_cache_file_is_named_with_the_rebuild_command(
    cache: Path, name: str, damage: Damage
) -> None:
    where = model_dir("tiny-omni", cache_dir=cache)
    path = _file(where, name)
    damage(path)
    for use in (require, prepare):
        with pytest.raises(ModelFileError) as info:
            use("tiny-omni", cache_dir=cache)
        assert info.value.path == path
        assert str(path) in str(info.value)
        assert f"omni-actors prepare tiny-omni --cache-dir {cache} --force" in str(info.value)


def test_the_prepare_command_reports_a_damaged_cache(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = _file(model_dir("tiny-omni", cache_dir=cache), "shard 1")
    _cut(damaged)
    assert main(["prepare", "tiny-omni", "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert str(damaged) in err
    assert "--force" in err
    assert "Traceback" not in err


def test_weights_only_in_a_pickle_format_are_never_loaded(cache: Path) -> None:
    where = model_dir("tiny-omni", cache_dir=cache)
    _pickle_release(where)
    for refuse in (
        lambda: require("tiny-omni", cache_dir=cache),
        lambda: weights.load(where, "code2wav"),
    ):
        with pytest.raises(ModelFileError, match=r"pytorch_model\.bin") as info:
            refuse()
        assert info.value.path == where


@pytest.mark.parametrize("damage", [_cut, _empty, _noise, _lying_header])
def test_a_damaged_shard_is_named_when_loading(cache: Path, damage: Damage) -> None:
    where = model_dir("tiny-omni", cache_dir=cache)
    last = _file(where, "shard -1")
    damage(last)
    with pytest.raises(ModelFileError, match="no valid safetensors") as info:
        weights.load(where, "code2wav")
    assert info.value.path == last
    assert layout.REBUILD in str(info.value)
    weights.load(where, "thinker")  # the thinker never opens code2wav's shard


def _config(**fields: object) -> Damage:
    def damage(path: Path) -> None:
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    return damage


def _code2wav_config(**fields: object) -> Damage:
    def damage(path: Path) -> None:
        config = json.loads(path.read_text())
        config["code2wav_config"].update(fields)
        path.write_text(json.dumps(config))

    return damage


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (_cut, "no valid JSON"),
        (_noise, "no valid JSON"),
        (lambda path: path.write_text("[1, 2]"), "JSON list"),
        (_config(code2wav_config=None), "has no code2wav_config"),
        (_code2wav_config(hidden_size="wide"), "no valid Qwen3OmniMoeCode2WavConfig"),
        (_code2wav_config(hidden_size=128), "of shape"),
        (_code2wav_config(num_hidden_layers=1), "which the code2wav its config describes has not"),
    ],
)
def test_a_damaged_config_is_named_when_loading(cache: Path, damage: Damage, problem: str) -> None:
    where = model_dir("tiny-omni", cache_dir=cache)
    damage(where / "config.json")
    with pytest.raises(ModelFileError, match=problem) as info:
        weights.load(where, "code2wav")
    assert info.value.path in (where / "config.json", where / INDEX)
    assert layout.REBUILD in str(info.value)


@pytest.mark.parametrize(
    "damage", [_cut, _config(talker_config={}), _config(talker_config={"accept_hidden_layer": "1"})]
)
def test_a_damaged_composite_config_is_named_by_the_thinker(cache: Path, damage: Damage) -> None:
    where = model_dir("tiny-omni", cache_dir=cache)
    damage(where / "config.json")
    with pytest.raises(ModelFileError) as info:
        ThinkerModel(where)
    assert info.value.path == where / "config.json"
