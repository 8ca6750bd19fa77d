"""``bench chaos`` at toy length on the scripted preset: workers are killed and
restarted, no turn hangs, nothing is left behind, and every outcome is accounted for."""

from __future__ import annotations

import subprocess
import sys

from omni_actors.bench.chaos import ChaosConfig, run_chaos_bench
from omni_actors.bench.soak import prepared


async def test_a_short_chaos_run_kills_restarts_and_accounts_for_every_turn() -> None:
    spec = prepared("scripted-omni", None, 0)
    config = ChaosConfig(
        sessions=2, seconds=4, kill_every_s=1.5, disconnect_p=0.2, drop_every=40, duplicate_every=7
    )
    result = await run_chaos_bench(spec, config, label="scripted-omni")
    assert result["kills"], "no worker was killed"
    assert sum(result["restarts"].values()) >= len(result["kills"])
    assert result["hung"] == 0
    assert result["met"]["hung"] is True
    ended = sum(result["turns"].values()) - sum(
        n for outcome, n in result["turns"].items() if outcome.startswith("not_admitted")
    )
    assert ended == result["turns_started"], result["turns"]
    assert result["conversations_lost"] == sum(  # "response_failed:" keeps the conversation
        n for o, n in result["turns"].items() if o.startswith("failed:")
    ) + sum(n for o, n in result["ended_between_turns"].items() if o.startswith("failed:"))
    assert result["leaked"] == {"fds": 0, "shm": 0, "children": 0, "tasks": 0}
    assert result["counts_end"]["children"] == 3  # every killed worker was replaced
    assert set(result["parameters"]["chunk_faults"]) <= {"thinker->talker", "talker->code2wav"}


def test_the_command_line_refuses_a_bad_probability() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", "bench", "chaos", "--disconnect-p", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert "disconnect_p must be in [0, 1]" in proc.stderr


def test_the_restart_intensity_admits_the_planned_kill_rate() -> None:
    """Kills every 1.5 s would exceed the default 3 restarts in 5 s and stop the pipeline:
    the bench measures recovery, so it raises the intensity to fit (and only then)."""
    from omni_actors.bench.chaos import _tolerant

    spec = prepared("scripted-omni", None, 0)
    assert spec.supervision.max_restarts == 3
    assert _tolerant(spec, 1.5).supervision.max_restarts == 5
    assert _tolerant(spec, 10.0) is spec
