"""``bench soak`` at toy length: the report's shape, every turn completed, nothing left
behind, and the command line's refusals."""

from __future__ import annotations

import subprocess
import sys

from omni_actors.bench.soak import prepared, run_soak_bench


async def test_a_short_soak_reports_growth_slopes_and_nothing_left() -> None:
    spec = prepared("scripted-omni", None, 0)
    steps: list[tuple[str, int, int]] = []
    result = await run_soak_bench(
        spec,
        sessions=2,
        minutes=0.05,
        interval_s=0.5,
        warmup_minutes=0,
        label="scripted-omni",
        progress=lambda step, number, total: steps.append((step, number, total)),
    )
    starts = [(step, number) for step, number, _ in steps if number != 3]
    assert starts == [
        ("starting scripted-omni", 1),
        ("warm-up: a conversation for each of 2 clients", 2),
        ("settling: counting what is left", 4),
    ]
    running = [step for step, number, _ in steps if number == 3]
    assert running[0] == "2 conversations at once for 0.05 min"
    assert len(running) == len(result["samples"]), "one line as each sample is taken"
    assert {total for _, _, total in steps} == {4}
    assert result["conversations"] >= 2
    assert set(result["outcomes"]) == {"completed"}
    assert result["turns"] == result["outcomes"]["completed"] > 0
    assert len(result["samples"]) >= 2
    assert {"rss_mb", "fds", "shm", "children", "tasks", "live_sessions"} <= set(
        result["slope_per_min"]
    )
    assert result["leaked"] == {"fds": 0, "shm": 0, "children": 0, "tasks": 0}
    assert isinstance(result["met"], bool)


def test_the_command_line_refuses_a_bad_count() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", "bench", "soak", "--sessions", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "--sessions" in proc.stderr
