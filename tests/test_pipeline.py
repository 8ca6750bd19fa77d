"""Pipeline definitions: presets, validation messages, DAG checks, modality paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from omni_actors.serving.pipeline_spec import (
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
            {"name": "talker", "engine": {"kind": "scripted"}},
            {"name": "code2wav", "engine": {"kind": "scripted"}},
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


def test_a_valid_file_loads(tmp_path: Path) -> None:
    spec = load_pipeline(_write(tmp_path, _base()))
    assert spec.entry_stage == "thinker"
    assert spec.edges[1].mode == "full"
    assert spec.downstream("thinker") == {"talker", "code2wav"}


def test_text_only_requests_skip_audio_stages() -> None:
    spec = PipelineSpec.model_validate(_base())
    assert spec.stages_for(text=True, audio=False) == ["thinker"]
    assert spec.stages_for(text=True, audio=True) == ["thinker", "talker", "code2wav"]
    assert spec.stages_for(text=False, audio=True) == ["thinker", "talker", "code2wav"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["stages"][1]["engine"].update(kind="onnx"), r"stages\[talker\]\.engine\.kind"),
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
        (lambda d: d["stages"].append({"name": "talker", "engine": {"kind": "torch"}}), "unique"),
        (lambda d: d.update(outputs={}), "name the stage"),
        (lambda d: d["edges"][0].update(fields=[]), r"edges\[0\]\.fields"),
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
