"""Every example runs to completion on its own and exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_supervised_pipeline_restarts_the_failed_stage_and_finishes() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "supervised_pipeline.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "transform restarted after ValueError('cannot decode chunk 3')" in done.stdout
    # Chunk 3 crashed the stage and is gone; the chunks queued behind it survived.
    assert "sink got: THE FIRST AUDIO LEAVES EARLY" in done.stdout
    assert done.stdout.rstrip().endswith("shut down cleanly")


def test_voice_agent_answers_two_turns_and_barges_in_on_the_third() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "voice_agent.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("turn 1: 32 text pieces, 5.12s audio, TTFT ")
    assert lines[1].startswith("turn 2: 32 text pieces, 5.12s audio, TTFT ")
    assert lines[2].startswith("turn 3: ended with Aborted: ")
    assert "barge-in" in lines[2]
    assert lines[-1] == "pipeline closed cleanly"


def test_voice_agent_runs_on_tiny_omni(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "OMNI_ACTORS_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "voice_agent.py"), "tiny-omni"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("turn 1: ")
    assert lines[1].startswith("turn 2: ")
    assert lines[2].startswith("turn 3: ended with Aborted: ")
    assert lines[-1] == "pipeline closed cleanly"
