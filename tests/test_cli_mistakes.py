"""Expected mistakes on the command line: one line on stderr (the traceback only at
``--log-level debug``), found before anything starts where they can be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_BROKEN = """
class Broken:
    inputs = {"text": "concat"}
    outputs = {"text": "concat"}

    def __init__(self, args):
        raise ValueError("no room for the cache")

    async def start(self): ...
    async def stop(self): ...
    async def abort(self, session): ...
    async def release(self, session): ...

    async def generate(self, session, inputs):
        async for chunk in inputs:
            yield chunk
"""

_WORDS = """
name: words
stages:
  - name: thinker
    engine: {kind: scripted, args: {outputs: 3, fields: [text]}}
outputs: {text: thinker}
"""


def _cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMNI_ACTORS_CACHE": str(cwd / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def _mistake(done: subprocess.CompletedProcess[str], command: str) -> str:
    """The one line of stderr that says what is wrong."""
    said = [line for line in done.stderr.splitlines() if line.startswith("omni-actors")]
    assert len(said) == 1, done.stderr
    assert said[0].startswith(f"omni-actors {command}: "), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr  # with "starting ..."
    return said[0]


@pytest.mark.parametrize("process", [False, True])
def test_an_engine_whose_init_raises_is_one_line(tmp_path: Path, process: bool) -> None:
    (tmp_path / "broken.py").write_text(_BROKEN)
    stage = f"  - name: only\n    process: {str(process).lower()}\n"
    engine = '    engine: {kind: "broken:Broken"}\n'
    yaml = "name: broken\nstages:\n" + stage + engine + "outputs: {text: only}\n"
    (tmp_path / "broken.yaml").write_text(yaml)
    done = _cli(tmp_path, "run", "--preset", "broken.yaml", "--text", "hi")
    assert done.returncode == 2
    line = _mistake(done, "run")
    assert "stage 'only'" in line
    assert "broken:Broken" in line
    assert "ValueError: no room for the cache" in line
    debug = _cli(tmp_path, "run", "--preset", "broken.yaml", "--text", "hi", "--log-level", "debug")
    assert debug.returncode == 2
    assert "Traceback" in debug.stderr
    # The engine's own frames, logged where it ran: a worker logs at the level it was
    # given, to the stderr it shares with the command.
    assert 'raise ValueError("no room for the cache")' in debug.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", ["run", "serve"])
def test_device_cuda_without_cuda_is_one_line_before_anything_starts(
    tmp_path: Path, command: str
) -> None:
    argv = ["--text", "hi", "--out", "o.wav"] if command == "run" else ["--port", "0"]
    done = _cli(tmp_path, command, "--preset", "tiny-omni", "--device", "cuda", *argv)
    assert done.returncode == 2
    line = _mistake(done, command)
    assert "--device cuda" in line
    assert "--device cpu" in line
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # no stage started


def test_run_on_a_text_only_pipeline_needs_no_out(tmp_path: Path) -> None:
    (tmp_path / "words.yaml").write_text(_WORDS)
    done = _cli(tmp_path, "run", "--preset", "words.yaml", "--text", "hi")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("t0 t1 t2")
    audio = _cli(tmp_path, "run", "--preset", "scripted-omni", "--text", "hi")
    assert audio.returncode == 2
    assert "give --out" in _mistake(audio, "run")


def test_a_usage_error_comes_before_torch_is_imported() -> None:
    code = (
        "import sys\n"
        "from omni_actors.cli import main\n"
        "assert main(['run']) == 2\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "omni-actors run: give --text, --audio or both"


def test_serve_refuses_a_certificate_without_its_key(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("")
    done = _cli(tmp_path, "serve", "--ssl-certfile", "cert.pem", "--port", "0")
    assert done.returncode == 2
    assert "ssl_keyfile" in _mistake(done, "serve")


def test_a_model_dir_that_is_no_release_is_not_told_to_rebuild_tiny_omni(tmp_path: Path) -> None:
    from omni_actors.actors.engines.qwen3_omni import weights
    from omni_actors.errors import ModelFileError

    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a model")
    with pytest.raises(ModelFileError) as info:
        weights.load(mine, "thinker")
    assert "prepare tiny-omni" not in str(info.value)
    assert "Qwen3-Omni release" in str(info.value)
