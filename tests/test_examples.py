"""Every example runs to completion on its own and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, *args: str, timeout: float = 60, **env: str) -> str:
    """Run ``examples/<name>`` in a fresh interpreter; its stdout, once it exited 0."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_supervised_pipeline_restarts_the_failed_stage_and_finishes() -> None:
    stdout = run_example("supervised_pipeline.py")
    assert "transform restarted after ValueError('cannot decode chunk 3')" in stdout
    # Chunk 3 crashed the stage and is gone; the chunks queued behind it survived.
    assert "sink got: THE FIRST AUDIO LEAVES EARLY" in stdout
    assert stdout.rstrip().endswith("shut down cleanly")


def test_voice_agent_answers_two_turns_and_barges_in_on_the_third() -> None:
    lines = run_example("voice_agent.py").splitlines()
    assert lines[0].startswith("turn 1: 32 text pieces, 5.12s audio, TTFT ")
    assert lines[1].startswith("turn 2: 32 text pieces, 5.12s audio, TTFT ")
    assert lines[2].startswith("turn 3: cancelled after ")
    assert lines[3].startswith("turn 4: 32 text pieces, 5.12s audio, TTFT ")
    assert lines[-1] == "pipeline closed cleanly"


def test_voice_agent_runs_on_tiny_omni(tmp_path: Path) -> None:
    lines = run_example(
        "voice_agent.py", "tiny-omni", timeout=120, OMNI_ACTORS_CACHE=str(tmp_path)
    ).splitlines()
    assert lines[0].startswith("turn 1: ")
    assert lines[1].startswith("turn 2: ")
    assert lines[2].startswith("turn 3: cancelled after ")
    assert lines[3].startswith("turn 4: ")
    assert lines[-1] == "pipeline closed cleanly"
