"""Each edge's path from the placement of its two stages: one process hands objects
over, two GPU stages in different processes get a device link, anything else goes
through the host; ``path`` in the YAML forces the host and refuses an impossible
device path at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from omni_actors.pipeline.spec.edge_paths import edge_paths
from omni_actors.pipeline.spec.pipeline import PipelineConfigError, load_pipeline


def spec(tmp_path: Path, talker: dict[str, Any], code2wav: dict[str, Any], **edge: Any) -> Any:
    data = {
        "name": "p",
        "stages": [
            {"name": "talker", "engine": {"kind": "qwen3-omni.talker"}, **talker},
            {"name": "code2wav", "engine": {"kind": "qwen3-omni.code2wav"}, **code2wav},
        ],
        "edges": [{"from": "talker", "to": "code2wav", **edge}],
        "outputs": {"audio": "code2wav"},
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_pipeline(path)


@pytest.mark.parametrize(
    ("talker", "code2wav", "path"),
    [
        ({}, {}, "object"),
        ({"device": "cuda"}, {"device": "cuda"}, "object"),
        ({"device": "cuda", "process": True}, {"device": "cuda"}, "device"),
        ({"device": "cuda:0", "process": True}, {"device": "cuda:1", "process": True}, "device"),
        ({"device": "auto", "process": True}, {"device": "auto", "process": True}, "device"),
        ({"device": "cuda", "process": True}, {"process": True}, "host"),
        # Replicas on two GPUs, one beside the receiver and one not: a link from each.
        ({"devices": ["cuda:0", "cuda:1"], "process": True}, {"device": "cuda:1"}, "device"),
        ({"devices": ["cuda:0", "cpu"], "process": True}, {"device": "cuda:1"}, "host"),
        ({"process": True}, {}, "host"),
    ],
)
def test_the_path_follows_the_placement(
    tmp_path: Path, talker: dict[str, Any], code2wav: dict[str, Any], path: str
) -> None:
    chosen, why = edge_paths(spec(tmp_path, talker, code2wav))[("talker", "code2wav")]
    assert chosen == path
    assert why.startswith("talker (")
    if "devices" in talker:
        assert why.startswith(f"talker ({', '.join(talker['devices'])}) -> code2wav (cuda:1)")


def test_the_yaml_can_force_the_host(tmp_path: Path) -> None:
    gpus = {"device": "cuda", "process": True}
    chosen, why = edge_paths(spec(tmp_path, gpus, gpus, path="host"))[("talker", "code2wav")]
    assert chosen == "host"
    assert "as the pipeline says" in why


@pytest.mark.parametrize(
    ("talker", "code2wav", "why"),
    [
        ({"device": "cuda"}, {"device": "cuda"}, "they share a process"),
        ({"device": "cuda", "process": True}, {}, "not both stages are on GPUs"),
    ],
)
def test_an_impossible_device_path_is_refused_at_load(
    tmp_path: Path, talker: dict[str, Any], code2wav: dict[str, Any], why: str
) -> None:
    with pytest.raises(PipelineConfigError, match=f"path device, but {why}"):
        spec(tmp_path, talker, code2wav, path="device")


def test_the_preset_on_gpus_links_its_worker_stages() -> None:
    paths = edge_paths(load_pipeline("tiny-omni").on_device("cuda"))
    assert paths[("thinker", "talker")][0] == "device"  # talker runs in a worker
    assert paths[("talker", "code2wav")][0] == "device"
    assert {p for p, _ in edge_paths(load_pipeline("tiny-omni")).values()} == {"host"}
