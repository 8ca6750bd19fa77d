"""``bench pipeline``'s concurrency levels: how many requests each runs
(``--requests``, ``--requests-per-level``), and the per-level figures of a model run
(means beside p50s, underruns), measured on scripted engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_actors.bench.models import run_model_bench
from omni_actors.bench.pipeline import default_requests, level_requests, requests_parameter
from omni_actors.cli import main

# The caller's player holds 200 ms back; each audio output is 10 ms and the next comes
# 400 ms later, so it runs dry once per reply (the margin, 190 ms, absorbs a loaded
# machine's jitter): the one underrun of each request is known in advance.
SLOW_AUDIO = """\
name: slow-audio
stages:
  - name: thinker
    engine: {kind: scripted, args: {first_output_s: 0.01, per_output_s: 0.01, outputs: 2}}
  - name: code2wav
    engine:
      kind: scripted
      args: {per_output_s: 0.4, outputs_per_input: 1, fields: [audio], audio_samples: 240}
edges:
  - {from: thinker, to: code2wav, mode: stream, fields: [hidden]}
outputs: {text: thinker, audio: code2wav}
"""


@pytest.fixture
def slow_audio(tmp_path: Path) -> Path:
    path = tmp_path / "slow-audio.yaml"
    path.write_text(SLOW_AUDIO)
    return path


def test_requests_per_level_runs_k_waves_of_each_level() -> None:
    # vllm-omni's CI: 4 x c.
    assert level_requests([1, 8, 32], None, 4, default_requests) == {1: 4, 8: 32, 32: 128}
    assert level_requests([1, 8], 5, None, default_requests) == {1: 5, 8: 5}
    assert level_requests([1, 8], None, None, default_requests) == {1: 20, 8: 24}
    assert requests_parameter(None, 4, "max(3*c, 20)") == "4*c"
    assert requests_parameter(5, None, "max(3*c, 20)") == 5
    assert requests_parameter(None, None, "max(3*c, 20)") == "max(3*c, 20)"


@pytest.mark.parametrize(
    ("requests", "per_level", "message"),
    [(2, 4, "give one"), (None, 0, "requests_per_level must be >= 1"), (0, None, ">= 1")],
)
def test_requests_and_requests_per_level_are_one_or_the_other(
    requests: int | None, per_level: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        level_requests([1], requests, per_level, default_requests)


def test_the_command_takes_requests_or_requests_per_level_not_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "pipeline", "--requests", "2", "--requests-per-level", "4"]

    with pytest.raises(SystemExit) as info:
        main(argv)

    assert info.value.code == 2
    assert "--requests-per-level: not allowed with argument --requests" in capsys.readouterr().err


def test_scripted_levels_run_k_times_c_requests(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "pipeline", "--preset", "scripted-omni", "--concurrency", "1", "2"]

    assert main([*argv, "--requests-per-level", "1", "--json", "--quiet"]) == 0

    report = json.loads(capsys.readouterr().out)
    levels = report["placements"]["local"]["variants"]["scripted-omni"]
    assert {c: level["requests"] for c, level in levels.items()} == {"1": 1, "2": 2}
    assert all(level["errors"] == 0 for level in levels.values())
    assert report["parameters"]["requests"] == "1*c"
    assert report["parameters"]["requests_per_level"] == 1


async def test_a_model_level_reports_means_p50s_and_underruns(slow_audio: Path) -> None:
    report = await run_model_bench(
        slow_audio, [1, 2], requests_per_level=1, full_edges=False, input_audio_s=()
    )

    levels = report["variants"]["slow-audio"]
    assert {c: level["requests"] for c, level in levels.items()} == {"1": 1, "2": 2}
    assert (report["parameters"]["requests"], report["parameters"]["requests_per_level"]) == (
        "1*c",
        1,
    )
    for c, level in levels.items():
        assert level["errors"] == 0, level.get("first_error")
        for figure in ("ttft_ms", "ttfa_ms", "rtf"):
            mean, p50 = level[f"{figure}_mean"], level[f"{figure}_p50"]
            assert mean > 0, (c, figure)
            assert p50 > 0, (c, figure)
            if level["requests"] <= 2:  # the median of one or two is their mean
                assert mean == pytest.approx(p50, abs=1e-3), (c, figure)
        assert level["ttfa_ms_mean"] >= level["ttft_ms_mean"]
        # One underrun per reply, each costing the wait for the next packet (~390 ms).
        assert level["underruns"] == level["requests"], c
        assert level["stall_ms"] > 300 * level["requests"], c
        audio_s = level["audio_s_mean"] * level["requests"]
        assert level["underruns_per_min"] == pytest.approx(
            level["underruns"] * 60 / audio_s, rel=1e-3
        )
        assert level["host_cpu_s_per_audio_s"] > 0
        # Each request's own figures, in the order sent, so a tail can be placed.
        samples = level["samples"]
        assert len(samples) == level["requests"]
        assert samples[0]["sent_ms"] == 0.0
        assert [s["sent_ms"] for s in samples] == sorted(s["sent_ms"] for s in samples)
        assert sum(s["ttft_ms"] for s in samples) / len(samples) == pytest.approx(
            level["ttft_ms_mean"], abs=1e-2
        )
        assert sum(s["underruns"] for s in samples) == level["underruns"]
        assert all(s["ttfa_ms"] >= s["ttft_ms"] and s["rtf"] > 0 for s in samples)


@pytest.mark.parametrize(
    ("option", "requests"),
    [([], None), (["--requests", "5"], 5), (["--requests-per-level", "3"], 3)],
)
def test_a_cluster_run_is_one_level_at_concurrency_one(
    option: list[str], requests: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omni_actors.bench import cluster

    passed: list[int | None] = []

    async def fake(
        preset: str, address: str, count: int | None, **kwargs: object
    ) -> dict[str, object]:
        passed.append(count)
        return {}

    monkeypatch.setattr(cluster, "run_cluster_bench", fake)

    assert main(["bench", "pipeline", "--cluster", "local-ray", *option, "--quiet"]) == 0
    assert passed == [requests]
