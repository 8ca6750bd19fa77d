"""The benchmark commands run and print well-formed numbers (no timing thresholds)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from omni_actors.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_bench_actors_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "actors", "--json", "--messages", "2000", "--asks", "200", "--repeat", "1"]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "tell_per_s",
        "queue_baseline_per_s",
        "tell_vs_queue_ratio",
        "ask_roundtrip_us_p50",
        "ask_roundtrip_us_p99",
    ):
        assert isinstance(result[key], int | float)
        assert math.isfinite(result[key])
        assert result[key] > 0
    assert result["messages"] == 2000


def test_bench_actors_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "actors", "--messages", "1000", "--asks", "10", "--repeat", "1"]) == 0
    assert "tell_vs_queue_ratio" in capsys.readouterr().out


def test_unknown_target_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "nothing"])
    assert info.value.code == 2


def test_example_runs_to_completion() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "supervised_pipeline.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "THE FIRST AUDIO LEAVES EARLY" in done.stdout
    assert "transform restarted" in done.stdout


def test_bench_transport_prints_every_variant(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "transport", "--json", "--sizes", "1KiB", "--scale", "0.01"])
    assert code == 0
    row = json.loads(capsys.readouterr().out)["sizes"]["1KiB"]
    for key in (
        "ours_us_p50",
        "baseline_us_p50",
        "raw_zmq_us_p50",
        "memcpy_us_p50",
        "speedup_vs_baseline",
        "overhead_vs_raw_zmq",
        "ratio_vs_memcpy",
    ):
        assert isinstance(row[key], int | float)
        assert math.isfinite(row[key])
        assert row[key] > 0
