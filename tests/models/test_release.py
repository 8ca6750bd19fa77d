"""The release layout: written shard by shard, read one stage at a time, refused when damaged.

A tiny release (three stages, four shards, code2wav alone in the last as in Qwen3-Omni) is
written with ``ReleaseWriter`` and read back with ``Release``; its files are then cut,
dropped or made to disagree with the index. The Hub is never reached: ``snapshot_download``
is replaced by a fake serving a local directory through huggingface_hub's own pattern
filter.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("safetensors")

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from omni_actors.errors import ModelFileError
from omni_actors.models.release import (
    INDEX,
    Release,
    ReleaseWriter,
    resolve_model,
    shard_patterns,
)


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, start: int) -> torch.Tensor:
    count = 1
    for size in shape:
        count *= size
    return (torch.arange(count, dtype=torch.float32) / 8 + start).reshape(shape).to(dtype)


# 64 + 64 + 32 | 64 + 8 | 24 + 6 bytes: with max_shard_bytes=100 the thinker takes two
# shards, the talker one, and new_shard() gives code2wav the last.
TENSORS: dict[str, torch.Tensor] = {
    "thinker.embed.weight": _tensor((4, 4), torch.float32, 0),
    "thinker.layers.0.weight": _tensor((4, 8), torch.bfloat16, 1),
    "thinker.norm.weight": _tensor((8,), torch.float32, 2),
    "talker.codec_head.weight": _tensor((8, 4), torch.bfloat16, 3),
    "talker.norm.weight": _tensor((4,), torch.float16, 4),
    "code2wav.decoder.weight": _tensor((2, 3), torch.float32, 5),
    "code2wav.decoder.bias": _tensor((3,), torch.bfloat16, 6),
}
CONFIG = {"architectures": ["Qwen3OmniMoeForConditionalGeneration"], "model_type": "tiny"}


def _shard(number: int) -> str:
    return f"model-{number:05d}-of-00004.safetensors"


EXPECTED_MAP = {
    "thinker.embed.weight": _shard(1),
    "thinker.layers.0.weight": _shard(2),
    "thinker.norm.weight": _shard(2),
    "talker.codec_head.weight": _shard(3),
    "talker.norm.weight": _shard(3),
    "code2wav.decoder.bias": _shard(4),
    "code2wav.decoder.weight": _shard(4),
}


def _write_release(out: Path, tokenizer: Path | None = None) -> Path:
    with ReleaseWriter(out, max_shard_bytes=100) as writer:
        writer.write_json("config.json", CONFIG)
        if tokenizer is not None:
            writer.copy_file(tokenizer)
        for name, tensor in TENSORS.items():
            if name == "code2wav.decoder.weight":  # the first of code2wav
                writer.new_shard()
            writer.add(name, tensor)
        return writer.finish()


def _read(release: Release, read: str, prefix: str) -> None:
    """Read ``prefix``'s shards as ``read`` (a method of ``Release``) does."""
    if read == "tensors":
        list(release.tensors(prefix))
    else:
        getattr(release, read)(prefix)


@pytest.fixture
def release_dir(tmp_path: Path) -> Path:
    return _write_release(tmp_path / "release")


def _index(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / INDEX).read_text())
    return data


def _rewrite_index(directory: Path, **changes: str | None) -> None:
    """Map each named tensor to another shard (``None``: drop it from the index)."""
    data = _index(directory)
    for name, shard in changes.items():
        if shard is None:
            del data["weight_map"][name]
        else:
            data["weight_map"][name] = shard
    (directory / INDEX).write_text(json.dumps(data))


def test_the_writer_shards_by_size_and_gives_code2wav_the_last_shard(
    tmp_path: Path, release_dir: Path
) -> None:
    index = _index(release_dir)
    assert index["weight_map"] == EXPECTED_MAP
    assert list(index["weight_map"]) == sorted(EXPECTED_MAP)
    size = sum(t.numel() * t.element_size() for t in TENSORS.values())
    assert index["metadata"] == {"total_size": size}
    assert sorted(p.name for p in release_dir.iterdir()) == sorted(
        [INDEX, "config.json", *(_shard(n) for n in range(1, 5))]
    )
    for number in range(1, 5):
        with safe_open(str(release_dir / _shard(number)), framework="pt") as handle:
            assert handle.metadata() == {"format": "pt"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release"]  # no staging left
    release = Release.open(release_dir)
    assert release.config == CONFIG
    assert release.names("code2wav.") == ["code2wav.decoder.bias", "code2wav.decoder.weight"]
    assert release.shards("code2wav.") == [release_dir / _shard(4)]
    assert release.shards("thinker.") == [release_dir / _shard(1), release_dir / _shard(2)]
    assert release.names("") == sorted(TENSORS)


def test_tensors_come_back_with_their_values_and_dtypes(release_dir: Path) -> None:
    release = Release.open(release_dir)
    for prefix in ("thinker.", "talker.", "code2wav."):
        loaded = dict(release.tensors(prefix))
        expected = {n[len(prefix) :]: t for n, t in TENSORS.items() if n.startswith(prefix)}
        assert loaded.keys() == expected.keys()
        for name, tensor in expected.items():
            assert loaded[name].dtype == tensor.dtype, name
            assert loaded[name].device == torch.device("cpu")
            assert torch.equal(loaded[name], tensor), name
    full = dict(release.tensors("talker.", strip=False))
    assert sorted(full) == ["talker.codec_head.weight", "talker.norm.weight"]


def test_a_stage_opens_only_its_own_shards(release_dir: Path) -> None:
    release = Release.open(release_dir)
    assert release.opened == []
    assert len(list(release.tensors("code2wav."))) == 2
    assert release.opened == [release_dir / _shard(4)]
    release.check("talker.")
    assert release.opened == [release_dir / _shard(4), release_dir / _shard(3)]
    expected = sum(
        t.numel() * t.element_size() for n, t in TENSORS.items() if n.startswith("thinker.")
    )
    assert release.tensor_bytes("thinker.") == expected == 160


def test_a_prefix_of_no_stage_names_the_index(release_dir: Path) -> None:
    release = Release.open(release_dir)
    with pytest.raises(ModelFileError, match=r"'vision\.'") as info:
        release.tensors("vision.")
    assert info.value.path == release_dir / INDEX
    assert release.opened == []


@pytest.mark.parametrize("read", ["shards", "tensors", "check", "tensor_bytes"])
def test_a_missing_shard_is_named_when_its_stage_is_read(release_dir: Path, read: str) -> None:
    (release_dir / _shard(2)).unlink()
    # Another stage's shards are all there (as after a download of that stage only).
    release = Release.open(release_dir)
    assert len(list(release.tensors("talker."))) == 2
    with pytest.raises(ModelFileError, match="is missing") as info:
        _read(release, read, "thinker.")
    assert info.value.path == release_dir / _shard(2)
    assert release.opened == [release_dir / _shard(3)]


def test_a_missing_config_is_named(release_dir: Path) -> None:
    (release_dir / "config.json").unlink()
    with pytest.raises(ModelFileError, match="is missing") as info:
        Release.open(release_dir)
    assert info.value.path == release_dir / "config.json"


@pytest.mark.parametrize("read", ["tensors", "check", "tensor_bytes"])
def test_a_truncated_shard_is_named_when_its_stage_is_read(release_dir: Path, read: str) -> None:
    shard = release_dir / _shard(3)
    shard.write_bytes(shard.read_bytes()[:-10])
    release = Release.open(release_dir)  # the index alone is read: it still opens
    assert dict(release.tensors("code2wav.")).keys() == {"decoder.bias", "decoder.weight"}
    with pytest.raises(ModelFileError, match="no valid safetensors") as info:
        _read(release, read, "talker.")
    assert info.value.path == shard


@pytest.mark.parametrize("read", ["tensors", "check"])
def test_a_shard_lacking_what_the_index_maps_to_it_is_named(release_dir: Path, read: str) -> None:
    _rewrite_index(release_dir, **{"thinker.norm.weight": _shard(1)})
    release = Release.open(release_dir)
    says = r"the index says it holds thinker\.norm\.weight; it does not"
    with pytest.raises(ModelFileError, match=says):
        _read(release, read, "thinker.")
    assert release.opened == [release_dir / _shard(1)]


@pytest.mark.parametrize(
    ("changes", "shard", "problem"),
    [
        # The talker's shard holds talker.norm.weight, which the index puts elsewhere.
        ({"talker.norm.weight": _shard(4)}, 3, f"the index maps it to {_shard(4)}"),
        ({"talker.norm.weight": None}, 3, "the index does not list it"),
    ],
)
@pytest.mark.parametrize("read", ["tensors", "check"])
def test_a_shard_holding_a_tensor_the_index_does_not_map_there_is_named(
    release_dir: Path, read: str, changes: dict[str, str | None], shard: int, problem: str
) -> None:
    _rewrite_index(release_dir, **changes)
    release = Release.open(release_dir)
    with pytest.raises(ModelFileError, match=problem) as info:
        _read(release, read, "talker.")
    assert info.value.path == release_dir / _shard(shard)
    assert "talker.norm.weight" in str(info.value)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"metadata": {"total_size": 1}, "weight_map": {"thinker.', "no valid JSON"),
        (json.dumps({"weight_map": {"a": "../x.safetensors"}}).encode(), "beside it"),
        (json.dumps({"weight_map": {"a": "/etc/x.safetensors"}}).encode(), "beside it"),
        (json.dumps({"weight_map": {"a": "pytorch_model.bin"}}).encode(), "beside it"),
        (json.dumps({"weight_map": {"a": 1}}).encode(), "no weight_map"),
    ],
)
def test_a_corrupt_index_is_named(release_dir: Path, content: bytes, problem: str) -> None:
    (release_dir / INDEX).write_bytes(content)
    with pytest.raises(ModelFileError, match=problem) as info:
        Release.open(release_dir)
    assert info.value.path == release_dir / INDEX


def test_a_single_file_release_is_one_shard(tmp_path: Path) -> None:
    save_file(dict(TENSORS), tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    release = Release.open(tmp_path)
    assert release.names("") == sorted(TENSORS)
    assert release.shards("talker.") == [tmp_path / "model.safetensors"]
    loaded = dict(release.tensors("talker."))
    assert torch.equal(loaded["codec_head.weight"], TENSORS["talker.codec_head.weight"])
    assert loaded["codec_head.weight"].dtype == torch.bfloat16
    assert release.opened == [tmp_path / "model.safetensors"]
    with pytest.raises(ModelFileError, match=r"'vision\.'") as info:
        release.shards("vision.")
    assert info.value.path == tmp_path / "model.safetensors"


def test_a_release_with_weights_only_in_a_pickle_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelFileError, match="pickle") as info:
        Release.open(tmp_path)
    assert info.value.path == tmp_path


def test_a_writer_failing_inside_with_leaves_nothing(tmp_path: Path) -> None:
    def write(out: Path) -> None:
        with ReleaseWriter(out, max_shard_bytes=100) as writer:
            writer.write_json("config.json", CONFIG)
            for name, tensor in TENSORS.items():
                writer.add(name, tensor)  # several shards written into staging by now
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        write(tmp_path / "release")
    assert list(tmp_path.iterdir()) == []


def test_a_writer_failing_leaves_an_earlier_release_untouched(
    tmp_path: Path, release_dir: Path
) -> None:
    before = {p.name: p.read_bytes() for p in release_dir.iterdir()}

    def write(out: Path) -> None:
        with ReleaseWriter(out) as writer:
            writer.add("thinker.embed.weight", torch.zeros(2))
            writer.new_shard()
            writer.add("code2wav.decoder.weight", torch.zeros(2))
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        write(release_dir)
    assert {p.name: p.read_bytes() for p in release_dir.iterdir()} == before
    assert list(tmp_path.iterdir()) == [release_dir]


def test_finish_replaces_an_earlier_release(tmp_path: Path, release_dir: Path) -> None:
    with ReleaseWriter(release_dir) as writer:
        writer.write_json("config.json", {"model_type": "other"})
        writer.add("code2wav.decoder.weight", torch.ones(3))
    release = Release.open(release_dir)
    assert release.config == {"model_type": "other"}
    assert release.names("") == ["code2wav.decoder.weight"]
    assert release.shards("") == [release_dir / "model-00001-of-00001.safetensors"]
    assert sorted(p.name for p in release_dir.iterdir()) == [
        "config.json",
        "model-00001-of-00001.safetensors",
        INDEX,
    ]
    assert list(tmp_path.iterdir()) == [release_dir]


def test_the_writer_refuses_a_name_twice_and_files_it_writes_itself(tmp_path: Path) -> None:
    with ReleaseWriter(tmp_path / "release") as writer:
        writer.write_json("config.json", CONFIG)
        writer.add("thinker.embed.weight", torch.zeros(2))
        with pytest.raises(ValueError, match="added twice"):
            writer.add("thinker.embed.weight", torch.ones(2))
        for name in (INDEX, "model-00001-of-00001.safetensors", "../config.json"):
            with pytest.raises(ValueError, match=re.escape(repr(name))):
                writer.write_json(name, {})
    assert torch.equal(
        dict(Release.open(tmp_path / "release").tensors(""))["thinker.embed.weight"],
        torch.zeros(2),
    )


def test_tied_tensors_are_written_each_in_full(tmp_path: Path) -> None:
    shared = torch.arange(6.0)
    with ReleaseWriter(tmp_path / "release") as writer:
        writer.write_json("config.json", CONFIG)
        writer.add("thinker.embed.weight", shared)
        writer.add("thinker.lm_head.weight", shared)
        writer.add("thinker.half", shared[:3])
    loaded = dict(Release.open(tmp_path / "release").tensors("thinker."))
    assert torch.equal(loaded["embed.weight"], shared)
    assert torch.equal(loaded["lm_head.weight"], shared)
    assert torch.equal(loaded["half"], shared[:3])


def test_shard_patterns_name_only_the_shards_of_the_prefixes(release_dir: Path) -> None:
    index = _index(release_dir)
    assert shard_patterns(index, ["code2wav."]) == [_shard(4)]
    assert shard_patterns(index, ["thinker.", "talker."]) == [_shard(n) for n in (1, 2, 3)]
    assert shard_patterns(index, [""]) == [_shard(n) for n in range(1, 5)]
    with pytest.raises(ModelFileError, match=r"'vision\.'"):
        shard_patterns(index, ["code2wav.", "vision."])
    # A crafted name cannot widen the download with a wildcard.
    assert shard_patterns({"weight_map": {"a": "*.safetensors"}}, ["a"]) == ["[*].safetensors"]
    with pytest.raises(ModelFileError, match="beside it"):
        shard_patterns({"weight_map": {"a": "../*.safetensors"}}, ["a"])


def test_a_local_directory_is_the_model(
    tmp_path: Path, release_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_model(release_dir) == release_dir
    assert resolve_model(str(release_dir)) == release_dir
    (tmp_path / "Qwen" / "Qwen3-Omni").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # a directory shaped like a repo id is a directory
    assert resolve_model("Qwen/Qwen3-Omni") == Path("Qwen/Qwen3-Omni")


@pytest.mark.parametrize(
    "model", ["no-such-model", "/no/such/dir", "a/b/c", "../x", "org/..", "org/a--b", ""]
)
def test_what_is_no_directory_and_no_repo_id_is_named(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Relative names resolve in an empty directory ("../x" is no sibling there), not in
    # wherever the suite runs from, whose parent may hold anything.
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(ModelFileError, match="no model directory and no Hugging Face repo id"):
        resolve_model(model, prefixes=["code2wav."])


def test_a_path_object_is_never_a_repo_id() -> None:
    with pytest.raises(ModelFileError, match="no model directory"):
        resolve_model(Path("org/name"))


class FakeHub:
    """``snapshot_download`` over the local directory ``remote``, caching into ``cache``.

    As the Hub without a cached listing of the repo does, a cached snapshot is returned
    whole or partial; a download adds the files the patterns match.
    """

    def __init__(self, remote: Path, cache: Path) -> None:
        self.remote = remote
        self.cache = cache
        self.downloads: list[list[str]] = []

    def __call__(
        self, repo_id: str, *, local_files_only: bool = False, allow_patterns: list[str]
    ) -> str:
        from huggingface_hub.errors import LocalEntryNotFoundError
        from huggingface_hub.utils import filter_repo_objects

        snapshot = self.cache / repo_id.replace("/", "--")
        if local_files_only:
            if not snapshot.is_dir():
                raise LocalEntryNotFoundError("not in the cache")
            return str(snapshot)
        snapshot.mkdir(parents=True, exist_ok=True)
        names = [p.name for p in self.remote.iterdir()]
        fetched = sorted(filter_repo_objects(names, allow_patterns=allow_patterns))
        for name in fetched:
            shutil.copyfile(self.remote / name, snapshot / name)
        self.downloads.append(fetched)
        return str(snapshot)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    tokenizer = tmp_path / "tokenizer_config.json"
    tokenizer.write_text("{}")
    remote = _write_release(tmp_path / "remote", tokenizer)
    (remote / "pytorch_model.bin").write_bytes(b"never downloaded")
    fake = FakeHub(remote, tmp_path / "hub")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.chdir(tmp_path)
    return fake


def test_a_repo_id_downloads_only_the_shards_of_its_stages(hub: FakeHub) -> None:
    text = ["config.json", INDEX, "tokenizer_config.json"]
    where = resolve_model("Qwen/tiny-release", prefixes=["code2wav."])
    assert where == hub.cache / "Qwen--tiny-release"
    assert hub.downloads == [text, sorted([*text, _shard(4)])]
    assert sorted(p.name for p in where.iterdir()) == sorted([*text, _shard(4)])
    assert dict(Release.open(where).tensors("code2wav.")).keys() == {
        "decoder.bias",
        "decoder.weight",
    }
    # Cached now: the same stage again downloads nothing; another stage, its own shards.
    assert resolve_model("Qwen/tiny-release", prefixes=["code2wav."]) == where
    assert len(hub.downloads) == 2
    resolve_model("Qwen/tiny-release", prefixes=["talker."])
    assert hub.downloads[2:] == [sorted([*text, _shard(3)])]
    resolve_model("Qwen/tiny-release")
    assert hub.downloads[3:] == [sorted([*text, *(_shard(n) for n in range(1, 5))])]


def test_a_repo_without_the_stage_is_refused_before_any_shard_downloads(hub: FakeHub) -> None:
    with pytest.raises(ModelFileError, match=r"'vision\.'") as info:
        resolve_model("Qwen/tiny-release", prefixes=["vision."])
    assert info.value.path.name == INDEX
    assert all(not name.endswith(".safetensors") for names in hub.downloads for name in names)


def test_an_unreachable_hub_names_the_repo(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo_id: str, *, local_files_only: bool = False, **_: object) -> str:
        if local_files_only:
            raise LocalEntryNotFoundError("not in the cache")
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr("huggingface_hub.snapshot_download", offline)
    with pytest.raises(ModelFileError, match="Name or service not known") as info:
        resolve_model("Qwen/tiny-release", prefixes=["code2wav."])
    assert str(info.value.path) == "Qwen/tiny-release"
