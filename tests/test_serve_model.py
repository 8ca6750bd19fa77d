"""``omni-actors serve MODEL``: the preset picked by the GPUs seen (counted without
torch, a fake count through ``$OMNI_ACTORS_GPUS``), and one line saying which and why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_actors.cli import serve_model
from omni_actors.cli.serve_model import GPUS_ENV, choose_preset, count_gpus

_HUB = "Qwen/Qwen3-Omni-30B-A3B-Instruct"


@pytest.mark.parametrize(
    ("gpus", "preset"), [(1, "qwen3-omni-1gpu"), (2, "qwen3-omni"), (8, "qwen3-omni")]
)
def test_a_full_size_release_takes_the_preset_of_the_gpus_seen(gpus: int, preset: str) -> None:
    choice = choose_preset(_HUB, gpus)
    assert choice.preset == preset
    assert f"{gpus} GPU" in choice.reason


def test_a_full_size_release_without_a_gpu_says_it_needs_one() -> None:
    with pytest.raises(ValueError, match="needs a GPU") as error:
        choose_preset(_HUB, 0)
    assert "--preset" in str(error.value)


def test_a_tiny_release_runs_on_the_cpu(tmp_path: Path) -> None:
    assert choose_preset("tiny-omni", 0).preset == "tiny-omni"
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 1024)
    assert choose_preset(str(tmp_path), 0).preset == "tiny-omni"
    assert choose_preset(str(tmp_path), 2).preset == "tiny-omni"


def test_a_large_release_directory_needs_a_gpu(tmp_path: Path) -> None:
    shard = tmp_path / "model-00001-of-00001.safetensors"
    with shard.open("wb") as out:  # sparse: its size, not its blocks
        out.truncate(serve_model.CPU_RELEASE_BYTES)
    assert choose_preset(str(tmp_path), 1).preset == "qwen3-omni-1gpu"
    with pytest.raises(ValueError, match="needs a GPU"):
        choose_preset(str(tmp_path), 0)


def test_gpus_are_counted_within_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GPUS_ENV, raising=False)
    monkeypatch.setattr(serve_model, "_nvidia_smi_gpus", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert count_gpus() == 4
    for visible, seen in [
        ("1", 1),
        ("0,3", 2),
        ("", 0),
        ("-1", 0),
        ("0,-1,2", 1),
        ("0,1,2,3,4", 4),
    ]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert count_gpus() == seen, visible
    monkeypatch.setenv(GPUS_ENV, "2")
    assert count_gpus() == 2
    monkeypatch.setenv(GPUS_ENV, "two")
    with pytest.raises(ValueError, match=GPUS_ENV):
        count_gpus()


def _serve(gpus: int, *argv: str) -> subprocess.CompletedProcess[str]:
    """``main(["serve", *argv])`` in a fresh interpreter with ``gpus`` GPUs seen; it
    asserts that torch was not imported."""
    code = (
        "import sys\n"
        "from omni_actors.cli import main\n"
        f"code = main(['serve', *{list(argv)!r}])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, GPUS_ENV: str(gpus)},
    )


@pytest.mark.parametrize(
    ("gpus", "preset"), [(2, "qwen3-omni"), (1, "qwen3-omni-1gpu"), (0, "tiny-omni")]
)
def test_serve_model_says_which_preset_it_took_before_torch(gpus: int, preset: str) -> None:
    # A bad --max-sessions stops it after the choice, before anything starts.
    model = "tiny-omni" if gpus == 0 else _HUB
    done = _serve(gpus, model, "--max-sessions", "0")
    assert done.returncode == 2, done.stderr
    said = done.stdout.strip().splitlines()
    assert said == [said[0]], done.stdout
    assert said[0].startswith(f"omni-actors serve: {model} on preset {preset}: "), said[0]
    assert "max_sessions" in done.stderr


def test_serve_model_without_a_gpu_is_one_line_before_torch() -> None:
    done = _serve(0, _HUB)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().startswith(f"omni-actors serve: {_HUB}: a full-size release needs")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_an_explicit_preset_is_kept_and_the_release_given_once() -> None:
    done = _serve(0, _HUB, "--preset", "tiny-omni", "--max-sessions", "0")
    assert done.returncode == 2
    assert done.stdout == "", "no preset was picked"
    assert "max_sessions" in done.stderr
    twice = _serve(0, _HUB, "--model", "tiny-omni")
    assert twice.returncode == 2
    assert "give the release once" in twice.stderr
