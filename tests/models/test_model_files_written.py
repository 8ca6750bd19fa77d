"""A generated checkpoint is moved in whole (``staging``) and checked file by file
(``check_present``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_actors.errors import ModelFileError
from omni_actors.models.files import check_present, staging


def test_a_staged_write_replaces_the_entries_it_wrote_and_leaves_the_others(
    tmp_path: Path,
) -> None:
    out = tmp_path / "model"
    (out / "llm").mkdir(parents=True)
    (out / "llm" / "old.json").write_text("old")
    (out / "kept.txt").write_text("kept")
    with staging(out, ".model-") as where:
        assert where.parent == tmp_path
        (where / "llm").mkdir()
        (where / "llm" / "config.json").write_text("{}")
        (where / "tokenizer.json").write_text("{}")
    assert sorted(p.name for p in (out / "llm").iterdir()) == ["config.json"]
    assert (out / "tokenizer.json").read_text() == "{}"
    assert (out / "kept.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging left


def test_an_interrupted_staged_write_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("old")

    def interrupted_write() -> None:
        with staging(out, ".model-") as where:
            (where / "config.json").write_text("new")
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        interrupted_write()
    assert (out / "config.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_the_first_missing_or_empty_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    check_present([tmp_path / "config.json"])
    names = ["config.json", "model.safetensors", "tokenizer.json"]
    with pytest.raises(ModelFileError, match=r"model\.safetensors: is missing or empty"):
        check_present(tmp_path / name for name in names)
    with pytest.raises(ModelFileError, match=r"tokenizer\.json: is missing or empty"):
        check_present([tmp_path / "tokenizer.json"])
