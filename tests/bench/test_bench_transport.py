"""``omni-actors bench transport`` runs every variant and cleans up after itself.

Only the shape of the result is checked: benchmarks are never timed assertions.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from omni_actors.cli import main

ROW_KEYS = (
    "ours_us_p50",
    "ours_us_p99",
    "baseline_us_p50",
    "raw_zmq_us_p50",
    "memcpy_us_p50",
    "speedup_vs_baseline",
    "overhead_vs_raw_zmq",
    "ratio_vs_memcpy",
)
SHM = Path("/dev/shm")


def _our_segments() -> set[str]:
    """Segments this process's bench could have left: its slabs and the baseline's."""
    if not SHM.is_dir():
        return set()
    mine = (f"omni-actors-{os.getpid()}-", f"bench-baseline-{os.getpid()}-")
    return {p.name for p in SHM.iterdir() if p.name.startswith(mine)}


def _children() -> set[int]:
    """Live child processes of this test process (Linux only; empty elsewhere)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def test_transport_bench_json_has_every_variant(capsys: pytest.CaptureFixture[str]) -> None:
    segments_before, children_before = _our_segments(), _children()

    code = main(["bench", "transport", "--json", "--sizes", "1KiB", "--iterations", "5"])

    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["sizes"]) == {"1KiB"}
    assert result["machine"]["cpus"] > 0
    assert result["baseline"].endswith("vllm_omni_baseline.py")
    row = result["sizes"]["1KiB"]
    for key in ROW_KEYS:
        assert isinstance(row[key], int | float), key
        assert math.isfinite(row[key]), key
        assert row[key] > 0, key
    assert row["iterations"] == 5
    assert _our_segments() <= segments_before
    assert _children() <= children_before


def test_transport_bench_rejects_an_unknown_size() -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "transport", "--sizes", "3KiB"])
    assert info.value.code == 2


def test_transport_bench_says_so_when_the_baseline_script_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "vllm_omni_baseline.py"

    with pytest.raises(SystemExit) as info:
        main(["bench", "transport", "--sizes", "1KiB", "--baseline", str(missing)])

    message = str(info.value.code)
    assert str(missing) in message
    assert "--no-baseline" in message


def test_transport_bench_runs_without_the_baseline_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["bench", "transport", "--json", "--sizes", "1KiB", "--iterations", "5", "--no-baseline"]
    )

    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["baseline"] == "skipped"
    row = result["sizes"]["1KiB"]
    assert row["baseline_us_p50"] is None
    assert row["speedup_vs_baseline"] is None
    assert row["ours_us_p50"] > 0


def test_transport_bench_profiles_our_round_trips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stats = tmp_path / "transport.pstats"
    argv = ["bench", "transport", "--json", "--sizes", "1KiB", "--iterations", "5"]

    assert main([*argv, "--no-baseline", "--profile", str(stats)]) == 0

    profile = json.loads(capsys.readouterr().out)["profile"]
    assert stats.is_file()
    functions = [row["function"] for row in profile["top"]]
    # The measured asks: our send and receive paths, not the worker's start-up.
    assert any("transport/link.py" in f for f in functions), functions
    assert any("transport/node.py" in f for f in functions), functions
