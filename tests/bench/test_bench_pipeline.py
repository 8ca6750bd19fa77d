"""``omni-actors bench pipeline``: the ideal simulation, and the command's shape.

The simulation is checked against timelines derived by hand from the declared
latencies; the command only for the shape and sanity of its numbers (benchmarks are
never timed assertions: the one bound used, measured >= ideal, holds on any machine
because scripted engines cannot compute faster than they declare).
"""

from __future__ import annotations

import json
import math
import pstats
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest

from omni_actors.bench import pipeline as pipeline_bench
from omni_actors.bench.ideal import IdealUnavailableError, ideal_times, path_hops
from omni_actors.bench.pipeline import bench_spec, placed, run_pipeline_bench
from omni_actors.cli import main
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline

LEVEL_KEYS = (
    "ttfa_ms_p50",
    "ttfa_ms_p99",
    "e2e_ms_p50",
    "rtf_p50",
    "ideal_ttfa_ms",
    "ideal_e2e_ms",
    "overhead_ms_per_hop_p50",
    "ttfa_vs_ideal",
    "errors",
    "requests",
)

# Chunks one request's stages send, each counted once per hop it crosses. stream: the
# thinker's 32 outputs to the talker (and an end marker) and to the caller, the talker's
# 64 codec frames to code2wav in 4 windows (4, 25, 25, 10), code2wav's 64 audio outputs
# to the caller. full: one payload per stage-to-stage edge instead.
CHUNK_HOPS = {"stream": 32 + 1 + 32 + 4 + 64, "full": 1 + 32 + 1 + 64}


def _spec(
    stages: list[dict[str, Any]], edges: list[dict[str, Any]], **outputs: str
) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": "sim", "stages": stages, "edges": edges, "outputs": outputs}
    )


def _scripted(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "engine": {"kind": "scripted", "args": args}}


# -- the ideal simulation --------------------------------------------------------------


def test_stream_pipeline_first_audio_by_hand() -> None:
    # thinker (entry mode): input at 0, output k at 50 + 10k ms (k = 0..31), last at 360.
    # talker (2 outputs per row, F 20, P 5): input 0 arrives at 50 -> outputs at 70, 75;
    #   input 1 arrives at 60 but the talker is busy until 75 -> outputs at 80, 85; from
    #   then on it runs flat out: frame k at 70 + 5k, frame 63 at 385.
    # window 4 / 25: frames 0-3 leave at 85 (frame 3), 4-28 at 210, 29-53 at 335, and
    #   the last 10 at the talker's finish, 385.
    # code2wav (1 output per row, F 10, P 2): takes frames 0-3 at 85 -> first audio at
    #   95 (then 97, 99, 101); F is paid once per session, so the final chunk, taken at
    #   385, yields 10 outputs P apart: the last audio at 385 + 10 * 2 = 405.
    # Sleeps on the path to the first audio: thinker 1, talker 4 (its outputs 0-3,
    #   the backlog making output 2 follow output 1), code2wav 1 = 6.
    ideal = ideal_times(bench_spec("stream"))

    assert ideal.ttfa_s == pytest.approx(0.095)
    assert ideal.e2e_s == pytest.approx(0.405)
    assert ideal.ttfa_sleeps == 6
    assert ideal.hops == 4  # input->thinker, thinker->talker, talker->code2wav, ->client
    assert ideal.audio_s == pytest.approx(64 * 1920 / 24000)
    assert ideal.outputs["talker"][:4] == pytest.approx([0.070, 0.075, 0.080, 0.085])
    assert ideal.outputs["talker"][-1] == pytest.approx(0.385)
    assert ideal.outputs["code2wav"][4] == pytest.approx(0.210 + 0.002)  # 2nd chunk, P only


def test_full_pipeline_waits_for_each_upstream_to_finish() -> None:
    # thinker: last output at 50 + 31 * 10 = 360 ms; the talker gets all 32 rows then:
    # 64 outputs from 380 to 380 + 63 * 5 = 695; code2wav gets 64 rows at 695: first
    # audio at 705, last at 705 + 63 * 2 = 831. Sleeps: 32 + 64 + 1 = 97.
    ideal = ideal_times(bench_spec("full"))

    assert ideal.ttfa_s == pytest.approx(0.705)
    assert ideal.e2e_s == pytest.approx(0.831)
    assert ideal.ttfa_sleeps == 97
    assert ideal.hops == 4


def test_scripted_omni_preset_matches_the_builtin_stream_pipeline() -> None:
    preset = ideal_times(load_pipeline("scripted-omni"))
    builtin = ideal_times(bench_spec("stream"))

    assert (preset.ttfa_s, preset.e2e_s) == pytest.approx((builtin.ttfa_s, builtin.e2e_s))


def test_window_flushes_the_partial_tail_when_the_upstream_finishes() -> None:
    # src: outputs at 100, 200, 300, 400, 500 ms. Window 2 / 2: frames 0-1 at 200,
    # 2-3 at 400, frame 4 (partial) at src's finish, 500. dec (F 10, P 1): 210, 211;
    # 401, 402; 501.
    spec = _spec(
        [
            _scripted("src", first_output_s=0.1, per_output_s=0.1, outputs=5, fields=["codes"]),
            _scripted(
                "dec", first_output_s=0.01, per_output_s=0.001, outputs_per_input=1,
                fields=["audio"],
            ),
        ],
        [
            {
                "from": "src", "to": "dec", "fields": ["codes"],
                "chunk_policy": {"initial_frames": 2, "frames": 2, "left_context": 1},
            }
        ],
        audio="dec",
    )  # fmt: skip
    ideal = ideal_times(spec)

    assert ideal.outputs["dec"] == pytest.approx([0.21, 0.211, 0.401, 0.402, 0.501])
    assert ideal.hops == 3


def test_full_edge_honours_the_receivers_replace_rule() -> None:
    # A replaced field keeps only the last output's row: one row -> 3 outputs, not 12.
    spec = _spec(
        [
            _scripted(
                "src", first_output_s=0.1, per_output_s=0.1, outputs=4, fields=["codes"],
                replace=["codes"],
            ),
            _scripted(
                "dec", first_output_s=0.01, per_output_s=0.001, outputs_per_input=3,
                fields=["audio"], replace=["codes"],
            ),
        ],
        [{"from": "src", "to": "dec", "mode": "full", "fields": ["codes"]}],
        audio="dec",
    )  # fmt: skip

    assert ideal_times(spec).outputs["dec"] == pytest.approx([0.41, 0.411, 0.412])


def test_hops_follow_the_longest_path_to_the_audio_stage() -> None:
    spec = _spec(
        [_scripted("a"), _scripted("b"), _scripted("c", fields=["audio"])],
        [
            {"from": "a", "to": "b", "fields": ["hidden"]},
            {"from": "b", "to": "c", "fields": ["hidden"]},
            {"from": "a", "to": "c", "fields": ["text"]},
        ],
        audio="c",
    )

    assert path_hops(spec) == 4


class Unscripted:
    """An engine the ideal knows nothing about (it is never started)."""

    inputs: ClassVar[dict[str, str]] = {"hidden": "concat"}
    outputs: ClassVar[dict[str, str]] = {"audio": "concat"}


def test_a_stage_that_is_not_scripted_has_no_ideal() -> None:
    kind = f"{__name__}:Unscripted"
    spec = _spec(
        [_scripted("thinker"), {"name": "talker", "engine": {"kind": kind}}],
        [{"from": "thinker", "to": "talker", "fields": ["hidden"]}],
        audio="talker",
    )

    with pytest.raises(IdealUnavailableError, match=f"stage talker runs a '{kind}' engine"):
        ideal_times(spec)


def test_an_audio_stage_without_audio_has_no_ideal() -> None:
    spec = _spec([_scripted("only")], [], audio="only")

    with pytest.raises(IdealUnavailableError, match="yields no 'audio' field"):
        ideal_times(spec)


# -- the command ---------------------------------------------------------------------------


def _number(value: object) -> float:
    assert isinstance(value, int | float), value
    assert not isinstance(value, bool), value
    assert math.isfinite(value), value
    return float(value)


def _check_variants(run: dict[str, Any]) -> None:
    """Both built-in variants at levels 1 and 2, every number sane, no errors."""
    assert set(run["variants"]) == {"stream", "full"}
    for variant, levels in run["variants"].items():
        assert set(levels) == {"1", "2"}, variant
        for level in levels.values():
            for key in LEVEL_KEYS:
                _number(level[key])
            assert level["errors"] == 0, level.get("first_error")
            assert level["requests"] == 2
            assert level["hops"] == 4
            assert level["ttfa_ms_p50"] >= 0.95 * level["ideal_ttfa_ms"]
            assert level["ttfa_ms_p99"] >= level["ttfa_ms_p50"]
            assert level["e2e_ms_p50"] >= 0.95 * level["ideal_e2e_ms"]
            assert level["ttfa_vs_ideal"] >= 0.95
            assert 0 < level["rtf_p50"] < 1
            _check_cpu(level, CHUNK_HOPS[variant])
    for c in ("1", "2"):
        assert 0 < _number(run["stream_vs_full_ttfa"][c]) < 1  # streaming pays off


def _check_cpu(level: dict[str, Any], chunk_hops: int) -> None:
    """What the measured requests cost: the chunks a request moves through its hops, and
    CPU per chunk-hop consistent with CPU per request."""
    assert level["chunk_hops_per_request"] == chunk_hops
    per_chunk = _number(level["cpu_us_per_chunk_hop"])
    per_request = _number(level["cpu_ms_per_request"])
    engines = _number(level["engine_cpu_ms_per_request"])
    framework = _number(level["framework_cpu_us_per_chunk_hop"])
    assert per_chunk > 0
    assert engines > 0
    assert per_chunk * chunk_hops / 1e3 == pytest.approx(per_request, rel=0.01)
    assert framework * chunk_hops / 1e3 == pytest.approx(per_request - engines, abs=0.01)
    assert _number(level["cpu_cores"]) > 0


def _check_targets(targets: dict[str, Any]) -> None:
    assert set(targets) == {
        "overhead_ms_per_hop_c1",
        "overhead_ms_per_hop_c64",
        "stream_ttfa_vs_ideal",
    }
    assert isinstance(targets["overhead_ms_per_hop_c1"]["met"], bool)
    assert targets["overhead_ms_per_hop_c64"]["met"] is None  # c=64 was not run
    assert isinstance(targets["stream_ttfa_vs_ideal"]["met"], bool)


def test_json_reports_both_variants_at_each_level(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "pipeline", "--json", "--concurrency", "1", "2", "--requests", "2"]
    code = main([*argv, "--placement", "local"])

    assert code == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one JSON object, nothing else
    result = json.loads(out)
    assert set(result["placements"]) == {"local"}
    _check_variants(result["placements"]["local"])
    assert set(result["targets"]) == {"local"}
    _check_targets(result["targets"]["local"])
    assert result["wire_ms_per_hop"] == {}  # nothing to compare with
    assert result["machine"]["loop"] in ("uvloop", "asyncio")
    assert _number(result["timer_overshoot_ms_per_sleep"]) >= 0


def test_progress_lines_go_to_stderr_and_stdout_stays_one_json_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "pipeline", "--json", "--concurrency", "1", "--requests", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 1
    assert set(json.loads(captured.out)["placements"]["local"]["variants"]) == {"stream", "full"}
    lines = captured.err.splitlines()
    steps = [
        re.fullmatch(r"bench pipeline: (.+) \((\d)/3\)\.\.\. \[\d+ s\]", line) for line in lines
    ]
    assert all(steps), lines
    assert [(m[1], m[2]) for m in steps if m] == [
        ("calibrating: timer overshoot, the engines' own CPU", "1"),
        ("local stream c=1", "2"),
        ("local full c=1", "3"),
    ]
    assert main([*argv, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    json.loads(captured.out)


async def test_process_placement_runs_every_stage_in_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[PipelineSpec] = []
    real_run_variant = pipeline_bench._run_variant

    async def recording(spec: PipelineSpec, *args: Any) -> dict[str, dict[str, Any]]:
        started.append(spec)
        return await real_run_variant(spec, *args)

    monkeypatch.setattr(pipeline_bench, "_run_variant", recording)
    result = await run_pipeline_bench([1, 2], 2, None, ["process", "local"])

    # Both placements measured, each variant in both; what ran is what was named.
    assert list(result["placements"]) == ["process", "local"]
    assert [spec.name for spec in started] == ["bench-stream", "bench-full"] * 2
    assert all(stage.process for spec in started[:2] for stage in spec.stages)
    assert not any(stage.process for spec in started[2:] for stage in spec.stages)
    for run in result["placements"].values():
        _check_variants(run)
    for targets in result["targets"].values():
        _check_targets(targets)
    for name in ("stream", "full"):
        for c in ("1", "2"):
            local = result["placements"]["local"]["variants"][name][c]["ttfa_ms_p50"]
            process = result["placements"]["process"]["variants"][name][c]["ttfa_ms_p50"]
            wire = _number(result["wire_ms_per_hop"][name][c])
            assert wire == pytest.approx((process - local) / 4, abs=1e-3)
    assert result["parameters"]["placements"] == ["process", "local"]


def test_placed_overrides_the_specs_own_placement() -> None:
    spec = bench_spec("stream")
    in_workers = placed(spec, "process")

    assert [s.process for s in in_workers.stages] == [True] * len(spec.stages)
    assert not any(s.process for s in placed(in_workers, "local").stages)
    assert in_workers.edges == spec.edges


async def test_library_call_measures_a_scripted_preset() -> None:
    result = await run_pipeline_bench([1], 1, "scripted-omni", ["local"])

    level = result["placements"]["local"]["variants"]["scripted-omni"]["1"]
    assert level["errors"] == 0, level.get("first_error")
    assert level["ideal_ttfa_ms"] == pytest.approx(95.0)
    assert level["ttfa_ms_p50"] >= 0.95 * level["ideal_ttfa_ms"]
    assert result["placements"]["local"]["stream_vs_full_ttfa"] == {}
    assert result["targets"]["local"]["stream_ttfa_vs_ideal"]["variant"] == "scripted-omni"


async def test_library_call_rejects_empty_levels() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        await run_pipeline_bench([0], 1, None)
    with pytest.raises(ValueError, match=">= 1"):
        await run_pipeline_bench([1], 0, None)
    with pytest.raises(ValueError, match="placements must be some of"):
        await run_pipeline_bench([1], 1, None, [])


def test_a_preset_with_bad_engine_args_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: real\n"
        "stages:\n"
        "  - {name: thinker, engine: {kind: scripted}}\n"
        "  - {name: code2wav, engine: {kind: scripted, args: {max_batch: 0}}}\n"
        "edges:\n"
        "  - {from: thinker, to: code2wav, fields: [hidden]}\n"
        "outputs: {audio: code2wav}\n"
    )

    # Refused before anything runs, with the field to fix.
    with pytest.raises(SystemExit, match=r"stages\[code2wav\]\.engine\.args\.max_batch: Extra"):
        main(["bench", "pipeline", "--preset", str(path), "--cache-dir", str(tmp_path)])


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "pipeline", "--concurrency", "0"],
        ["bench", "pipeline", "--concurrency"],
        ["bench", "pipeline", "--requests", "-1"],
        ["bench", "pipeline", "--placement", "remote"],
    ],
)
def test_bad_arguments_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_profile_writes_the_statistics_and_names_the_top_functions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stats = tmp_path / "nested" / "pipeline.pstats"
    argv = ["bench", "pipeline", "--json", "--concurrency", "1", "--requests", "2"]

    assert main([*argv, "--profile", str(stats)]) == 0

    profile = json.loads(capsys.readouterr().out)["profile"]
    assert profile["file"] == str(stats)
    assert pstats.Stats(str(stats)).total_calls > 0  # type: ignore[attr-defined]
    functions = [row["function"] for row in profile["top"]]
    assert len(functions) == 25
    # Only the measured requests are in it: the stages' per-chunk code, not set-up.
    assert any("actors/stage/outlet.py" in f for f in functions), functions
    shares = [row["own_share"] for row in profile["top"]]
    assert shares == sorted(shares, reverse=True)
    assert 0 < sum(shares) <= 1


def test_profile_is_refused_for_a_model_preset() -> None:
    with pytest.raises(SystemExit, match="--profile profiles the scripted pipelines"):
        main(["bench", "pipeline", "--preset", "tiny-omni", "--profile", "x.pstats"])


# -- model presets: options --------------------------------------------------------------


@pytest.mark.parametrize(
    "option", ["--input-tokens", "--output-tokens", "--reply-tokens", "--frames-per-token"]
)
@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_token_counts_below_one_are_usage_errors(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "pipeline", "--preset", "tiny-omni", option, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert option in err
    assert "must be >= 1" in err or "invalid positive_int value" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--input-tokens", "10"], "--input-tokens"),
        (["--preset", "scripted-omni", "--input-tokens", "10"], "--input-tokens"),
        (["--model", "/models/q3", "--frames-per-token", "2"], "--model, --frames-per-token"),
        (["--streaming-only"], "--streaming-only"),
    ],
)
def test_model_options_on_a_scripted_pipeline_are_refused(argv: list[str], named: str) -> None:
    with pytest.raises(SystemExit, match=f"^omni-actors bench pipeline: {named} measures a model"):
        main(["bench", "pipeline", *argv])


def test_model_options_with_a_cluster_are_refused() -> None:
    argv = ["bench", "pipeline", "--cluster", "local-ray", "--input-tokens", "8"]
    with pytest.raises(SystemExit, match="--input-tokens measures a model preset on local"):
        main(argv)


def _recorded(monkeypatch: pytest.MonkeyPatch, error: Exception | None = None) -> dict[str, Any]:
    """Stand in for ``run_model_bench``: what the command passed it (or raise ``error``)."""
    from omni_actors.bench import models

    passed: dict[str, Any] = {}

    async def fake(preset: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        passed.update(preset=preset, levels=args[0], requests=args[1], **kwargs)
        if error is not None:
            raise error
        return {"variants": {}, "stream_vs_full_ttfa": {}}

    monkeypatch.setattr(models, "run_model_bench", fake)
    return passed


def test_model_options_reach_the_model_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    # benchmarks/qwen3_omni_random_gpu.sh's pipeline step.
    passed = _recorded(monkeypatch)
    argv = ["bench", "pipeline", "--preset", "qwen3-omni", "--model", "/models/q3", "--json"]
    argv += ["--input-tokens", "2500", "--output-tokens", "256", "--frames-per-token", "2"]
    argv += ["--concurrency", "1", "4", "8", "16", "32", "--streaming-only", "--quiet"]

    assert main([*argv, "--requests-per-level", "4", "--no-input-length"]) == 0

    expected = {
        "preset": "qwen3-omni",
        "levels": [1, 4, 8, 16, 32],
        "requests": None,
        "requests_per_level": 4,
        "model": "/models/q3",
        "input_tokens": 2500,
        "output_tokens": 256,
        "frames_per_token": 2,
        "full_edges": False,
        "input_audio_s": (),
    }
    assert {key: passed[key] for key in expected} == expected


def test_reply_tokens_is_output_tokens_by_its_old_name(monkeypatch: pytest.MonkeyPatch) -> None:
    passed = _recorded(monkeypatch)
    argv = ["bench", "pipeline", "--preset", "tiny-omni", "--reply-tokens", "7", "--json"]

    assert main([*argv, "--quiet", "--no-input-length"]) == 0

    assert passed["output_tokens"] == 7
    assert passed["input_tokens"] is None
    assert passed["full_edges"] is True


def test_a_prompt_the_model_bench_cannot_make_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from omni_actors.bench.random_prompts import PromptLengthError

    _recorded(monkeypatch, PromptLengthError("the entry stage loads no model"))
    argv = ["bench", "pipeline", "--preset", "tiny-omni", "--input-tokens", "9", "--quiet"]

    with pytest.raises(SystemExit, match=r"^omni-actors bench pipeline: the entry stage loads"):
        main(argv)
