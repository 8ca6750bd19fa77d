"""A model preset's ``bench pipeline`` report: the table beside vllm-omni's published
figures, the qwen3-omni goals, and replies whose audio has a set length."""

from __future__ import annotations

from typing import Any

import pytest

from omni_actors.bench import models
from omni_actors.bench.models import fixed_frames, model_table
from omni_actors.bench.pipeline_targets import (
    QWEN3_OMNI_TARGETS,
    VLLM_OMNI_2XH100,
    qwen3_omni_targets,
)
from omni_actors.pipeline.spec.pipeline import PipelineConfigError, load_pipeline
from omni_actors.protocols.control import LinkCounts


def _level(ttft: float, rtf: float) -> dict[str, Any]:
    return {
        "requests": 8,
        "errors": 1,
        "ttft_ms_mean": ttft + 4,
        "ttft_ms_p50": ttft,
        "ttfa_ms_mean": 236.0,
        "ttfa_ms_p50": 230.4,
        "ttfa_ms_p90": 251.0,
        "rtf_mean": rtf,
        "rtf_p50": rtf - 0.01,
        "output_tokens_per_s": 812.34,
        "underruns": 3,
        "engine_busy": {
            "thinker": {"device": "cuda:0", "busy_fraction": 0.9312, "eager_steps": 0},
            "talker": {"device": "cuda:1", "busy_fraction": None, "eager_steps": 7},
            "code2wav": {"device": "cuda:1", "busy_fraction": 0.1, "eager_steps": None},
        },
        "host_cpu_s_per_audio_s": 0.0213,
    }


def test_the_qwen3_omni_table_sets_vllm_omnis_figures_beside_each_level() -> None:
    report = {
        "variants": {"qwen3-omni": {"1": _level(90.2, 0.101), "32": _level(480.0, 0.55)}},
        "reference": VLLM_OMNI_2XH100.report(),
    }

    table = model_table(report)

    assert table[1] == "qwen3-omni (engines: thinker cuda:0, talker cuda:1, code2wav cuda:1)"
    assert table[2].split() == [
        "c", "ok/req", "TTFT", "mean/p50", "vllm-omni", "1st", "audio", "mean/p50/p90", "RTF",
        "mean/p50", "vllm-omni", "text", "tok/s", "underruns", "busy",
        "thinker/talker/code2wav", "CPU", "s/audio", "s", "eager", "thinker/talker/code2wav",
    ]  # fmt: skip
    assert table[3].split() == [
        "1", "7/8", "94/90", "96", "236/230/251", "0.101/0.091", "0.118", "812.3", "3",
        "0.93/-/0.10", "0.021", "0/7/-",
    ]  # fmt: skip
    assert table[4].split()[:4] == ["32", "7/8", "484/480", "508"]
    assert table[4].split()[6] == "0.420"
    assert table[5] == f"vllm-omni: {VLLM_OMNI_2XH100.source}"


def test_a_level_reports_each_stage_s_eager_steps_over_its_requests() -> None:
    spec = load_pipeline("tiny-omni")
    busy_s: dict[str, float | None] = {"thinker": 1.0, "talker": 1.0, "code2wav": 1.0}
    before = models._Counts(busy_s, {"thinker": 5, "talker": 0, "code2wav": None})
    later: dict[str, float | None] = {"thinker": 2.0, "talker": 2.0, "code2wav": 2.0}
    after = models._Counts(later, {"thinker": 8, "talker": 0, "code2wav": None})
    cost = models._cost(2.0, 1.0, before, after)

    busy = models._level([], cost, spec)["engine_busy"]

    assert {actor: figures["eager_steps"] for actor, figures in busy.items()} == {
        "thinker": 3,  # the steps of this level's requests, not since the engine started
        "talker": 0,
        "code2wav": None,  # no graphs
    }
    assert busy["thinker"]["busy_fraction"] == 0.5


def test_each_replica_reports_its_own_device() -> None:
    spec = load_pipeline("qwen3-omni")
    thinker = spec.stage("thinker").model_dump(by_alias=True)
    thinker.update(devices=["cuda:0", "cuda:1"], device=None)
    del thinker["replicas"]  # one per device
    thinker["engine"]["args"].pop("device")
    data = spec.model_dump(by_alias=True)
    data["stages"] = [thinker, *data["stages"][1:]]
    placed = type(spec).model_validate(data)
    busy_s: dict[str, float | None] = {"thinker-0": 1.0, "thinker-1": 1.0, "talker": 1.0}
    counts = models._Counts(busy_s, dict.fromkeys(busy_s, 0))
    cost = models._cost(2.0, 1.0, counts, counts)

    busy = models._level([], cost, placed)["engine_busy"]

    assert {actor: figures["device"] for actor, figures in busy.items()} == {
        "thinker-0": "cuda:0",
        "thinker-1": "cuda:1",
        "talker": "cuda:1",
    }


def test_a_stage_restarted_during_a_level_reports_no_count() -> None:
    assert models._delta({"talker": 9, "code2wav": 1}, {"talker": 2, "code2wav": 1}) == {
        "talker": None,  # its new engine counts from 0
        "code2wav": 0,
    }


def test_other_presets_have_no_reference_column() -> None:
    table = model_table({"variants": {"tiny-omni": {"1": _level(90.2, 0.101)}}})

    assert "vllm-omni" not in "\n".join(table)
    assert table[3].split()[:3] == ["1", "7/8", "94/90"]


def test_a_report_without_the_new_figures_shows_dashes() -> None:
    # A report written before means and underruns were measured still renders.
    level = _level(90.2, 0.101)
    del level["ttft_ms_mean"], level["ttfa_ms_mean"], level["underruns"]

    row = model_table({"variants": {"tiny-omni": {"1": level}}})[3].split()

    assert row[:4] == ["1", "7/8", "-/90", "-/230/251"]
    assert row[6] == "-"


def test_qwen3_omni_goals_per_level() -> None:
    levels = {"1": {"ttft_ms_p50": 95.0, "ttfa_ms_p50": 240.0, "rtf_p50": 0.09}}

    goals = qwen3_omni_targets(levels)

    assert set(goals) == {f"{k}_c{c}" for c, limits in QWEN3_OMNI_TARGETS.items() for k in limits}
    assert goals["ttft_ms_p50_c1"] == {"limit": 96.0, "measured": 95.0, "met": True}
    assert goals["ttfa_ms_p50_c1"] == {"limit": 250.0, "measured": 240.0, "met": True}
    assert goals["rtf_p50_c1"]["met"] is True
    assert goals["rtf_p50_c32"] == {"limit": 0.40, "measured": None, "met": None}  # not run


def test_published_figures_are_keyed_by_level_as_the_report_is() -> None:
    reference = VLLM_OMNI_2XH100.report()

    assert VLLM_OMNI_2XH100.preset == load_pipeline("qwen3-omni").name
    assert reference["ttft_ms"] == {"1": 96.0, "4": 141.0, "8": 272.0, "16": 362.0, "32": 508.0}
    assert reference["rtf"] == {"1": 0.118, "4": 0.18, "8": 0.2, "16": 0.328, "32": 0.42}


@pytest.mark.parametrize("preset", ["tiny-omni", "qwen3-omni"])
def test_fixed_frames_makes_every_talker_speak_a_set_length(preset: str) -> None:
    spec = fixed_frames(load_pipeline(preset), 3)

    talker = spec.stage("talker").engine.args
    assert (talker["frames_per_token"], talker["stop_at_codec_eos"]) == (3, False)
    assert "frames_per_token" not in spec.stage("thinker").engine.args


def test_fixed_frames_needs_a_talker() -> None:
    with pytest.raises(PipelineConfigError, match="no stage's engine takes frames_per_token"):
        fixed_frames(load_pipeline("scripted-omni"), 2)


def test_a_level_reports_what_each_stage_s_device_links_sent() -> None:
    spec = load_pipeline("tiny-omni")
    busy_s: dict[str, float | None] = {"thinker": 1.0, "talker": 1.0, "code2wav": 1.0}
    eager: dict[str, int | None] = dict.fromkeys(busy_s, 0)
    before = models._Counts(
        busy_s,
        eager,
        links={
            "thinker": LinkCounts(placed=10, host=3, unmarked=0),
            "talker": None,  # its link to code2wav not offered yet
            "code2wav": None,
        },
    )
    after = models._Counts(
        busy_s,
        eager,
        links={
            "thinker": LinkCounts(placed=25, host=7, unmarked=2),
            "talker": LinkCounts(placed=40, host=1, unmarked=0),
            "code2wav": None,
        },
    )

    busy = models._level([], models._cost(2.0, 1.0, before, after), spec)["engine_busy"]

    assert {actor: figures["links"] for actor, figures in busy.items()} == {
        "thinker": {"placed": 15, "host": 4, "unmarked": 2},  # this level's, not since start
        "talker": {"placed": 40, "host": 1, "unmarked": 0},  # its link came up meanwhile
        "code2wav": None,  # it sends on no device link
    }
    restarted = models._links_delta(
        {"thinker": LinkCounts(placed=9, host=0, unmarked=0)},
        {"thinker": LinkCounts(placed=2, host=0, unmarked=0)},
    )
    assert restarted == {"thinker": None}  # a new stage counts from 0


def test_the_steps_table_shows_each_stage_s_link_messages() -> None:
    level = _level(90.2, 0.101)
    steps = {
        "steps": 10,
        "steps_per_s": 5.0,
        "decode_rows_per_step": 2.0,
        "prefill_steps": 1,
        "prefill_step_ms_mean": 50.0,
        "decode_step_ms_mean": 9.0,
        "prefill_wait_ms_mean": 1.0,
        "decode_wait_ms_mean": 0.5,
    }
    level["engine_busy"]["thinker"] |= {
        "steps": steps,
        "links": {"placed": 15, "host": 4, "unmarked": 2},
    }
    level["engine_busy"]["code2wav"] |= {"steps": steps, "links": None}

    table = model_table({"variants": {"tiny-omni": {"1": level}}})

    assert table[4].split()[-1] == "placed/host/unm."
    assert table[5].split()[1] == "thinker"
    assert table[5].split()[-1] == "15/4/2"
    assert table[6].split()[1] == "code2wav"
    assert table[6].split()[-1] == "-"
