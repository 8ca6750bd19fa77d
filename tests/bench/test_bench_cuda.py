"""``omni-actors bench cuda`` on the CPU: every size and mode runs, every hand-off arrives,
and a row that fails (a lost hand-off, a sink's worker dying) is that row's error while
the rest of the report still runs and is printed.

Only the shape and the hand-off count are checked: benchmarks are never timed assertions,
and without CUDA the copies are synchronous, so the overheads mean nothing here.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest
from dying_sink import DECODE_TOKENS, DyingSink

from omni_actors.bench import cuda as cuda_bench
from omni_actors.bench.cuda import MODES, CudaBenchConfig, run_cuda_bench
from omni_actors.bench.cuda_cli import SIZES, cuda_config, cuda_table
from omni_actors.cli import main
from omni_actors.cli.bench import add_bench_arguments

SIZE_KEYS = (
    "sync_overhead_pct",
    "async_overhead_pct",
    "hop_ms_p50",
    "hop_ms_p90",
    "hop_one_way_ms_p50",
    "hop_sync_ms_p50",
    "hop_sync_one_way_ms_p50",
)


def _tiny(**overrides: Any) -> CudaBenchConfig:
    sizes = dict(hidden=16, layers=1, tokens_decode=2, tokens_prefill=8)
    return CudaBenchConfig.for_device("cpu", **(sizes | dict(steps=4, warmup=2) | overrides))


async def test_cpu_run_has_every_size_and_mode_and_every_hand_off_arrived() -> None:
    result = await run_cuda_bench(_tiny())

    json.dumps(result)  # JSON-ready as returned
    assert result["device"] == "cpu"
    assert result["parameters"]["dtype"] == "float32"
    assert set(result["sizes"]) == set(SIZES)
    sent = 4 + 4 * 2  # every measured step, and the warm-up steps of each of 4 rounds
    assert result["parameters"]["rounds"] == 4
    for size, row in result["sizes"].items():
        assert row["bytes"] == row["tokens"] * 16 * 4, size
        assert set(row["modes"]) == set(MODES), size
        for mode, numbers in row["modes"].items():
            assert numbers["handed_off"] == (0 if mode == "none" else sent), (size, mode)
            for key in ("step_ms_p50", "step_ms_p90"):
                assert math.isfinite(numbers[key]), (size, mode, key)
                assert numbers[key] > 0, (size, mode, key)
        for key in SIZE_KEYS:
            assert math.isfinite(row[key]), (size, key)
        assert row["target_async_overhead_pct"] == 2
        assert row["met"] is (row["async_overhead_pct"] <= 2)
    assert result["code_predictor"] == {"skipped": "needs CUDA"}
    assert result["hop_paths"] == {"skipped": "needs CUDA"}
    assert result["link_ready"] == {"skipped": "needs CUDA"}
    assert "skipped" in result["tiny_omni"]
    assert result["failed_rows"] == []
    table = "\n".join(cuda_table(result))
    assert "decode" in table
    assert "prefill" in table


async def test_a_hand_off_that_never_arrives_fails_its_row_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    send = cuda_bench._hand_off
    dropped = False

    async def drop_the_third(sink: Any, staging: Any, seq: int, step: Any) -> None:
        nonlocal dropped
        if seq == 2 and step.host is not None and not dropped:  # decode's first sync run
            dropped = True
            return
        await send(sink, staging, seq, step)

    monkeypatch.setattr(cuda_bench, "_hand_off", drop_the_third)

    result = await run_cuda_bench(_tiny())

    json.dumps(result)
    error = result["sizes"]["decode"]["error"]
    assert error.startswith("HandOffLostError: decode/sync: the sink took 2 hand-offs"), error
    assert "of 3 sent" in error
    assert set(result["sizes"]["prefill"]["modes"]) == set(MODES)  # the next size still ran
    assert result["failed_rows"] == ["sizes.decode"]
    assert "decode   failed: HandOffLostError" in "\n".join(cuda_table(result))


def test_a_dead_sink_worker_fails_its_row_and_the_report_is_still_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cuda_bench, "HiddenSink", DyingSink)
    argv = ["bench", "cuda", "--json", "--device", "cpu", "--steps", "4", "--warmup", "2"]
    argv += ["--hidden", "16", "--layers", "1", "--tokens-prefill", "8", "--no-pipeline"]
    argv += ["--tokens-decode", str(DECODE_TOKENS)]

    code = main(argv)

    assert code == 1  # printed whole, then exits 1: a row failed
    result = json.loads(capsys.readouterr().out)
    error = result["sizes"]["decode"]["error"]
    assert error.startswith("WorkerDiedError: "), error
    assert "killed by signal 11" in error
    assert set(result["sizes"]["prefill"]["modes"]) == set(MODES)  # a fresh sink served it
    assert result["failed_rows"] == ["sizes.decode"]
    assert result["code_predictor"] == {"skipped": "needs CUDA"}
    assert result["link_ready"] == {"skipped": "needs CUDA"}


def test_the_command_line_options_make_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    argv = "cuda --json --device cpu --steps 4 --warmup 2 --sizes decode --hidden 32"
    argv += " --layers 1 --tokens-decode 2 --tokens-prefill 8 --no-pipeline --requests 2"
    argv += " --cache-dir /tmp/oa-cache --seed 3"

    ns = parser.parse_args(argv.split())

    assert ns.target == "cuda"
    assert ns.json
    assert cuda_config(ns) == CudaBenchConfig(
        device="cpu",
        steps=4,
        warmup=2,
        sizes=("decode",),
        hidden=32,
        layers=1,
        tokens_decode=2,
        tokens_prefill=8,
        pipeline=False,
        requests=2,
        cache_dir=Path("/tmp/oa-cache"),
        seed=3,
    )
    defaults = cuda_config(parser.parse_args(["cuda", "--device", "cpu"]))
    assert defaults == CudaBenchConfig.for_device("cpu")
    assert not defaults.pipeline  # the CPU smoke test's defaults
    assert defaults.hidden < 4096


@pytest.mark.parametrize(
    "argv",
    [
        ["--sizes", "decode,huge"],
        ["--steps", "0"],
        ["--hidden", "x"],
    ],
)
def test_bad_options_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "cuda", "--device", "cpu", *argv])
    assert info.value.code == 2
