"""The model cache: idempotent prepare, seeds, interrupted builds, damaged files, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_actors.errors import ModelFileError
from omni_actors.models import cache as model_cache
from omni_actors.models.cache import ModelNotPreparedError, is_prepared, model_dir, prepare, require
from omni_actors.models.family import ModelFamily, Progress, UnknownModelError
from omni_actors.models.files import read_json

BUILDS: list[tuple[Path, int]] = []


def _build(out_dir: Path, seed: int, progress: Progress | None = None) -> None:
    if seed == 13:
        raise RuntimeError("interrupted")
    BUILDS.append((out_dir, seed))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "weights.bin").write_text(str(seed))
    if progress is not None:
        progress("weights", 1, 1)


@pytest.fixture
def fake_family() -> ModelFamily:
    BUILDS.clear()
    return ModelFamily(name="fake", engines={}, prepare=_build)


def _build_config(out_dir: Path, seed: int, progress: Progress | None = None) -> None:
    _build(out_dir, seed, progress)
    (out_dir / "config.json").write_text(json.dumps({"seed": seed}))


def _verify_config(out_dir: Path) -> None:
    read_json(out_dir / "config.json")


@pytest.fixture
def checked_family() -> ModelFamily:
    """A family whose ``verify`` reads its one file, as a real family checks its files."""
    BUILDS.clear()
    return ModelFamily(
        name="checked",
        engines={},
        prepare=_build_config,
        verify=_verify_config,
    )


def test_prepare_builds_once_per_seed(tmp_path: Path, fake_family: ModelFamily) -> None:
    steps: list[tuple[str, int, int]] = []
    where = prepare(fake_family, cache_dir=tmp_path, progress=lambda *a: steps.append(a))
    assert where == tmp_path / "fake" / "seed-0"
    assert (where / "weights.bin").read_text() == "0"
    assert steps == [("weights", 1, 1)]
    assert prepare(fake_family, cache_dir=tmp_path) == where  # idempotent
    assert len(BUILDS) == 1
    prepare(fake_family, cache_dir=tmp_path, seed=7)
    assert is_prepared(fake_family, cache_dir=tmp_path, seed=7)
    prepare(fake_family, cache_dir=tmp_path, force=True)
    assert [seed for _, seed in BUILDS] == [0, 7, 0]


def test_an_interrupted_build_is_not_prepared(tmp_path: Path, fake_family: ModelFamily) -> None:
    with pytest.raises(RuntimeError, match="interrupted"):
        prepare(fake_family, cache_dir=tmp_path, seed=13)
    assert not is_prepared(fake_family, cache_dir=tmp_path, seed=13)
    with pytest.raises(ModelNotPreparedError, match="omni-actors prepare fake --seed 13"):
        require(fake_family, cache_dir=tmp_path, seed=13)


def test_require_names_the_command(tmp_path: Path, fake_family: ModelFamily) -> None:
    with pytest.raises(ModelNotPreparedError) as info:
        require(fake_family, cache_dir=tmp_path)
    assert f"omni-actors prepare fake --cache-dir {tmp_path}" in str(info.value)
    prepare(fake_family, cache_dir=tmp_path)
    assert require(fake_family, cache_dir=tmp_path) == model_dir(fake_family, cache_dir=tmp_path)


def test_a_corrupt_manifest_means_not_prepared(tmp_path: Path, fake_family: ModelFamily) -> None:
    where = prepare(fake_family, cache_dir=tmp_path)
    (where / "prepared.json").write_text("{not json")
    assert not is_prepared(fake_family, cache_dir=tmp_path)
    prepare(fake_family, cache_dir=tmp_path)
    assert len(BUILDS) == 2


def test_unknown_families_and_the_default_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnknownModelError, match="tiny-omni"):
        model_dir("gpt-17")
    monkeypatch.setenv("OMNI_ACTORS_CACHE", "/somewhere/cache")
    assert model_cache.default_cache_dir() == Path("/somewhere/cache")
    monkeypatch.delenv("OMNI_ACTORS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert model_cache.default_cache_dir() == Path("/xdg/omni-actors")


@pytest.mark.parametrize("damage", [b'{"seed": ', b"", b"\x00\xff junk"])
def test_a_damaged_prepared_file_is_named_with_the_rebuild_command(
    tmp_path: Path, checked_family: ModelFamily, damage: bytes
) -> None:
    where = prepare(checked_family, cache_dir=tmp_path, seed=3)
    assert require(checked_family, cache_dir=tmp_path, seed=3) == where
    (where / "config.json").write_bytes(damage)
    assert is_prepared(checked_family, cache_dir=tmp_path, seed=3)  # the manifest is intact
    rebuild = f"omni-actors prepare checked --seed 3 --cache-dir {tmp_path} --force"
    with pytest.raises(ModelFileError) as info:
        require(checked_family, cache_dir=tmp_path, seed=3)
    assert info.value.path == where / "config.json"
    assert str(where / "config.json") in str(info.value)
    assert rebuild in str(info.value)
    assert f"or delete {where}" in str(info.value)
    # Preparing again does not hand the damaged directory out, nor rebuild it unasked.
    with pytest.raises(ModelFileError, match="--force"):
        prepare(checked_family, cache_dir=tmp_path, seed=3)
    assert len(BUILDS) == 1
    prepare(checked_family, cache_dir=tmp_path, seed=3, force=True)
    assert require(checked_family, cache_dir=tmp_path, seed=3) == where
    assert len(BUILDS) == 2


def test_a_deleted_prepared_file_is_named(tmp_path: Path, checked_family: ModelFamily) -> None:
    where = prepare(checked_family, cache_dir=tmp_path)
    (where / "config.json").unlink()
    with pytest.raises(ModelFileError, match="is missing") as info:
        require(checked_family, cache_dir=tmp_path)
    assert f"omni-actors prepare checked --cache-dir {tmp_path} --force" in str(info.value)


def test_a_cache_an_older_version_prepared_is_prepared_again(
    tmp_path: Path, fake_family: ModelFamily
) -> None:
    where = prepare(fake_family, cache_dir=tmp_path)
    manifest = where / "prepared.json"
    older = {**json.loads(manifest.read_text()), "format": model_cache._FORMAT - 1}
    manifest.write_text(json.dumps(older))
    (where / "weights.bin").write_text("stale")
    assert require(fake_family, cache_dir=tmp_path) == where  # no error, no command to run
    assert (where / "weights.bin").read_text() == "0"
    assert is_prepared(fake_family, cache_dir=tmp_path)
    assert len(BUILDS) == 2
    # A newer format is another version's: not rebuilt behind its back.
    newer = {**older, "format": model_cache._FORMAT + 1}
    manifest.write_text(json.dumps(newer))
    with pytest.raises(ModelNotPreparedError):
        require(fake_family, cache_dir=tmp_path)
