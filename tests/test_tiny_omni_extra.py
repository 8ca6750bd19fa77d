"""``pip install omni-actors`` without the ``tiny-omni`` extra: what works, what says why.

transformers and safetensors come with the extra only. Without them a scripted pipeline
must run as before, and every way into tiny-omni must stop with the command that installs
the extra (not a bare ``ModuleNotFoundError`` or a traceback). The dev install has them,
so a child interpreter hides them (``None`` in ``sys.modules`` makes an import fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

INSTALL = "pip install 'omni-actors[tiny-omni]'"

_WITHOUT_EXTRA = """
import contextlib, importlib, io, json, sys
sys.modules["transformers"] = None
sys.modules["safetensors"] = None
cache, wav = sys.argv[1], sys.argv[2]
seen = {}

from omni_actors.cli import main
from omni_actors.errors import MissingExtraError
for module in ("configs", "stepping", "weights", "thinker_engine", "talker_engine",
               "code2wav_engine", "code2wav_model"):
    try:
        importlib.import_module(f"omni_actors.actors.engines.qwen3_omni.{module}")
        seen[module] = "imported"
    except MissingExtraError as exc:
        seen[module] = str(exc)

from omni_actors.actors.engines.registry import build_engine
try:
    build_engine("qwen3-omni.thinker", {"cache_dir": cache})
except Exception as exc:
    seen["engine"] = f"{type(exc).__name__}: {exc}"

for name, argv in {
    "prepare": ["prepare", "tiny-omni", "--cache-dir", cache],
    "run_tiny": ["run", "--text", "hi", "--cache-dir", cache, "--out", wav],
    "run_scripted": ["run", "--preset", "scripted-omni", "--text", "hi", "--out", wav],
}.items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except Exception as exc:  # reported to the test that checks this command
            code = f"raised {type(exc).__name__}: {exc}"
    seen[name] = {"code": code, "stderr": err.getvalue()}
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def without_extra(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What each way into omni-actors did in an interpreter without the extra."""
    tmp = tmp_path_factory.mktemp("no-extra")
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRA, str(tmp / "cache"), str(tmp / "reply.wav")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    seen["wav"] = (tmp / "reply.wav").is_file()
    return seen


@pytest.mark.parametrize(
    "module",
    [
        "configs",
        "stepping",
        "weights",
        "thinker_engine",
        "talker_engine",
        "code2wav_engine",
        "code2wav_model",
    ],
)
def test_every_tiny_omni_model_module_names_the_extra(
    without_extra: dict[str, Any], module: str
) -> None:
    assert INSTALL in without_extra[module]
    assert "transformers is missing" in without_extra[module]


def test_a_tiny_omni_engine_is_unavailable_with_the_install_command(
    without_extra: dict[str, Any],
) -> None:
    assert without_extra["engine"].startswith("EngineUnavailableError: engine 'qwen3-omni.thinker'")
    assert INSTALL in without_extra["engine"]


@pytest.mark.parametrize("command", ["prepare", "run_tiny"])
def test_cli_says_what_to_install_without_a_traceback(
    without_extra: dict[str, Any], command: str
) -> None:
    result = without_extra[command]
    assert result["code"] == 2
    assert INSTALL in result["stderr"]
    assert "Traceback" not in result["stderr"]


def test_a_scripted_pipeline_needs_no_extra(without_extra: dict[str, Any]) -> None:
    assert without_extra["run_scripted"]["code"] == 0, without_extra["run_scripted"]["stderr"]
    assert without_extra["wav"]
