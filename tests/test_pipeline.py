"""Pipeline definitions: presets, validation messages, DAG checks, modality paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD
from omni_actors.pipeline.spec.pipeline import (
    PipelineConfigError,
    PipelineSpec,
    load_pipeline,
    preset_names,
)


def _base() -> dict[str, Any]:
    return {
        "name": "p",
        "stages": [
            {"name": "thinker", "engine": {"kind": "scripted"}},
            {"name": "talker", "engine": {"kind": "scripted", "args": {"fields": ["codes"]}}},
            {"name": "code2wav", "engine": {"kind": "scripted", "args": {"fields": ["audio"]}}},
        ],
        "edges": [
            {"from": "thinker", "to": "talker", "fields": ["hidden"]},
            {"from": "talker", "to": "code2wav", "fields": ["codes"], "mode": "full"},
        ],
        "outputs": {"text": "thinker", "audio": "code2wav"},
    }


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_presets_load_by_name() -> None:
    assert "scripted-omni" in preset_names()
    spec = load_pipeline("scripted-omni")
    assert [s.name for s in spec.stages] == ["thinker", "talker", "code2wav"]
    assert spec.edges[1].chunk_policy is not None
    assert spec.edges[1].chunk_policy.initial_frames == 4


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name",
    [
        "qwen3-omni",
        "qwen3-omni-1gpu",
        "qwen3-omni-vllm",
        str(REPO / "benchmarks" / "qwen3_omni_random.yaml"),
    ],
)
def test_code2wav_warms_the_windows_its_edge_cuts(name: str) -> None:
    """The windows warmed at load are those the talker edge's chunk policy cuts, but the
    last: a change to one without the other would only show as capture stalls."""
    import torch

    spec = load_pipeline(name)
    (edge,) = [e for e in spec.edges if e.to == "code2wav"]
    (stage,) = [s for s in spec.stages if s.name == "code2wav"]
    assert edge.chunk_policy is not None
    window = edge.chunk_policy.policy().window()
    cut = {(c.frames.shape[0], c.context) for c in window.push(torch.zeros(1000, 1))}
    warmed = {(w["frames"], w.get("left_context", 0)) for w in stage.engine.args["warm_windows"]}
    assert warmed == cut


@pytest.mark.parametrize("name", ["qwen3-omni", "qwen3-omni-1gpu", "qwen3-omni-vllm"])
def test_qwen3_omni_presets_reply_at_length_and_ramp_as_tiny_omni(name: str) -> None:
    """Replies end at the model's end of turn or transformers' 1024 tokens (not a shorter
    cap), and the audio ramps up from the first packet as tiny-omni's does, over the
    real decoder's 72 frames of context."""
    spec = load_pipeline(name)
    tiny = load_pipeline("tiny-omni")
    (edge,) = [e for e in spec.edges if e.to == "code2wav"]
    (tiny_edge,) = [e for e in tiny.edges if e.to == "code2wav"]
    assert edge.chunk_policy is not None
    assert tiny_edge.chunk_policy is not None

    assert spec.stage("thinker").engine.args["max_new_tokens"] == 1024
    assert edge.chunk_policy.ramp == tiny_edge.chunk_policy.ramp != ()
    assert edge.chunk_policy.initial_frames == tiny_edge.chunk_policy.initial_frames
    assert edge.chunk_policy.left_context == 72


def test_a_pipeline_without_its_transcriber_serves_the_same_replies() -> None:
    spec = load_pipeline("tiny-omni")
    assert spec.outputs.transcript == "transcriber"
    bare = spec.without_transcriber()
    assert bare.outputs.transcript is None
    assert [s.name for s in bare.stages] == [s.name for s in spec.stages if s.name != "transcriber"]
    assert bare.edges == spec.edges
    assert bare.without_transcriber() is bare  # none to drop


def test_a_chunk_ramp_reaches_the_stages_and_a_bad_one_is_named(tmp_path: Path) -> None:
    spec = load_pipeline("tiny-omni")
    (edge,) = [e for e in spec.edges if e.to == "code2wav"]
    assert edge.chunk_policy is not None
    assert edge.chunk_policy.ramp == (4, 8, 16)
    assert edge.chunk_policy.window() == (4, 25, 25, (4, 8, 16))
    data = _base()
    data["edges"][1]["chunk_policy"] = {"ramp": [8, 0]}
    where = r"edges\[1\]\.chunk_policy\.ramp\[1\]: Input should be greater"
    with pytest.raises(PipelineConfigError, match=where):
        load_pipeline(_write(tmp_path, data))


def test_a_valid_file_loads(tmp_path: Path) -> None:
    spec = load_pipeline(_write(tmp_path, _base()))
    assert spec.entry_stage == "thinker"
    assert spec.edges[1].mode == "full"
    assert spec.downstream("thinker") == {"talker", "code2wav"}


def test_entry_inputs_are_what_the_entry_engine_declares() -> None:
    data = _base()
    data["stages"][0]["engine"]["args"] = {"inputs": ["text", "audio"]}
    spec = PipelineSpec.model_validate(data)
    assert spec.entry_inputs() == {"text", "audio"}
    assert INSTRUCTIONS_FIELD not in spec.entry_inputs()  # no place for a system prompt


def test_text_only_requests_skip_audio_stages() -> None:
    spec = PipelineSpec.model_validate(_base())
    assert spec.stages_for(text=True, audio=False) == ["thinker"]
    assert spec.stages_for(text=True, audio=True) == ["thinker", "talker", "code2wav"]
    assert spec.stages_for(text=False, audio=True) == ["thinker", "talker", "code2wav"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["stages"][1]["engine"].update(kind="onnx"),
            r"stages\[talker\]\.engine\.kind: unknown engine kind 'onnx'; known: .*scripted",
        ),
        (
            lambda d: d["stages"][1]["engine"].update(kind="vllm"),
            r"stages\[talker\]\.engine\.args\.model: Field required",
        ),
        (
            lambda d: d["stages"][1]["engine"]["args"].update(outputs_per_input=0, colour=1),
            r"stages\[talker\]\.engine\.args\.outputs_per_input: Input should be greater than"
            r"(.|\n)*stages\[talker\]\.engine\.args\.colour: Extra inputs",
        ),
        (
            lambda d: d["stages"][1].update(accumulate={"hidden": "replace"}),
            r"stages\[talker\]\.accumulate: Extra inputs are not permitted",
        ),
        (
            lambda d: d["stages"][1].update(supervision={"max_restarts": 1}),
            r"stages\[talker\]\.supervision: Extra inputs are not permitted",
        ),
        (
            lambda d: d.update(supervision={"backoff_min_s": 2, "backoff_max_s": 1}),
            r"backoff_max_s must be >= backoff_min_s",
        ),
        (
            lambda d: d["edges"][0].update(mode="async"),
            r"edges\[0\]\.mode: Input should be 'stream' or 'full'",
        ),
        (lambda d: d["stages"][0].update(replicas=0), r"stages\[thinker\]\.replicas"),
        (lambda d: d["stages"][0].update(colour="red"), r"colour: Extra inputs are not permitted"),
        (
            lambda d: d["edges"].append({"from": "code2wav", "to": "thinker", "fields": ["x"]}),
            "cycle",
        ),
        (lambda d: d["edges"].pop(), r"not reachable from entry 'thinker': \['code2wav'\]"),
        (
            lambda d: d["edges"].append({"from": "talker", "to": "ghost", "fields": ["x"]}),
            "no stage 'ghost'",
        ),
        (
            lambda d: d["stages"].append({"name": "talker", "engine": {"kind": "scripted"}}),
            "unique",
        ),
        (lambda d: d.update(outputs={}), "name the stage"),
        (lambda d: d["edges"][0].update(fields=[]), r"edges\[0\]\.fields"),
        (lambda d: d.update(flow={"window": 0}), r"flow\.window: Input should be greater than"),
    ],
)
def test_validation_errors_name_the_file_and_field(
    tmp_path: Path, mutate: Any, message: str
) -> None:
    data = _base()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(PipelineConfigError, match=message) as info:
        load_pipeline(path)
    assert str(path) in str(info.value)


def test_unreadable_and_malformed_sources(tmp_path: Path) -> None:
    with pytest.raises(PipelineConfigError, match="no preset named 'nope'"):
        load_pipeline("nope")
    with pytest.raises(PipelineConfigError, match="cannot read"):
        load_pipeline(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [unclosed")
    with pytest.raises(PipelineConfigError, match="not valid YAML"):
        load_pipeline(bad)
    bad.write_text("- a list\n")
    with pytest.raises(PipelineConfigError, match="mapping at the top level"):
        load_pipeline(bad)


# -- edges against the engines' declarations ------------------------------------------


def _problem(tmp_path: Path, data: dict[str, Any], message: str) -> str:
    path = _write(tmp_path, data)
    with pytest.raises(PipelineConfigError, match=message) as info:
        load_pipeline(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_an_edge_field_the_source_does_not_yield(tmp_path: Path) -> None:
    data = _base()
    data["edges"][0]["fields"] = ["codes"]
    _problem(
        tmp_path,
        data,
        r"edges\[thinker->talker\]\.fields: thinker \(scripted\) does not yield 'codes' "
        r"\(it yields token_ids, hidden, text\)",
    )


def test_an_edge_field_the_receiver_does_not_take(tmp_path: Path) -> None:
    data = _base()
    data["stages"][1]["engine"]["args"]["inputs"] = ["hidden"]
    data["edges"][0]["fields"] = ["hidden", "token_ids"]
    _problem(
        tmp_path,
        data,
        r"edges\[thinker->talker\]\.fields: talker \(scripted\) does not take 'token_ids' "
        r"\(it takes hidden\)",
    )


def test_an_edge_whose_ends_declare_different_rules(tmp_path: Path) -> None:
    data = _base()
    data["stages"][1]["engine"]["args"]["replace"] = ["hidden"]
    _problem(
        tmp_path,
        data,
        r"edges\[thinker->talker\]\.fields: 'hidden' is concat as thinker's output but "
        r"replace as talker's input",
    )
    data["stages"][0]["engine"]["args"] = {"replace": ["hidden"]}
    spec = load_pipeline(_write(tmp_path, data))  # both ends agree: valid
    assert spec.accumulate("talker")["hidden"] == "replace"


def test_edge_fields_default_to_what_both_ends_declare(tmp_path: Path) -> None:
    data = _base()
    for edge in data["edges"]:
        del edge["fields"]
    spec = load_pipeline(_write(tmp_path, data))
    assert spec.edge_fields("thinker", "talker") == ("token_ids", "hidden", "text")
    assert spec.edge_fields("talker", "code2wav") == ("codes",)
    data["stages"][2]["engine"]["args"]["inputs"] = ["audio"]
    _problem(
        tmp_path,
        data,
        r"edges\[talker->code2wav\]\.fields: talker \(scripted\) yields nothing code2wav "
        r"\(scripted\) takes \(talker yields codes; code2wav takes audio\)",
    )


def test_a_window_needs_exactly_one_field(tmp_path: Path) -> None:
    data = _base()
    data["edges"][0].update(fields=["hidden", "token_ids"], chunk_policy={})
    _problem(
        tmp_path,
        data,
        r"edges\[thinker->talker\]\.chunk_policy: windows one field of codec frames, but the "
        r"edge carries \['hidden', 'token_ids'\]",
    )


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    data = _base()
    data["stages"][0]["engine"]["kind"] = "onnx"
    data["edges"][1]["fields"] = ["audio"]
    text = _problem(tmp_path, data, r"\(2 problem\(s\)\)")
    assert "stages[thinker].engine.kind: unknown engine kind" in text
    assert "edges[talker->code2wav].fields: talker (scripted) does not yield 'audio'" in text


WHOLE = """
class Whole:
    inputs = {"codes": "concat"}
    outputs = {"audio": "concat"}
    streams_input = False
"""


def test_a_stream_edge_into_an_engine_that_needs_the_whole_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "whole_input_engines.py").write_text(WHOLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = _base()
    data["stages"][2]["engine"] = {"kind": "whole_input_engines:Whole"}
    data["edges"][1]["mode"] = "stream"
    _problem(
        tmp_path,
        data,
        r"edges\[talker->code2wav\]\.mode: code2wav \(whole_input_engines:Whole\) cannot "
        r"take streamed input; use mode: full",
    )
    data["edges"][1]["mode"] = "full"
    assert load_pipeline(_write(tmp_path, data)).ports("code2wav").streams_input is False


# -- supervision -------------------------------------------------------------------------


def test_restart_intensity_is_the_pipelines_and_restart_type_each_stages(tmp_path: Path) -> None:
    from omni_actors.pipeline.orchestrator import pipeline_strategy

    data = _base()
    data["supervision"] = {
        "max_restarts": 7,
        "period_s": 2.5,
        "backoff_min_s": 0.1,
        "backoff_max_s": 0.4,
    }
    data["stages"][1]["restart"] = "transient"
    spec = load_pipeline(_write(tmp_path, data))
    strategy = pipeline_strategy(spec)
    assert (strategy.max_restarts, strategy.period) == (7, 2.5)
    assert (strategy.backoff.min_s, strategy.backoff.max_s) == (0.1, 0.4)
    assert [s.restart for s in spec.stages] == ["permanent", "transient", "permanent"]


def test_model_stages_are_pointed_at_one_weights_cache() -> None:
    spec = load_pipeline("scripted-omni")
    assert spec.model_families() == {}
    assert spec.with_weights(seed=3) == spec  # no model family: nothing changes
