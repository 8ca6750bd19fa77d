"""The scale-out YAML: ``cluster`` and per-stage ``placement`` (no Ray needed here)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from omni_actors import Props
from omni_actors.pipeline.spec.pipeline import PipelineConfigError, PipelineSpec, load_pipeline
from omni_actors.transport.worker_hosts import LOCAL


def _with(placement: dict[str, Any] | None, cluster: dict[str, Any] | None) -> dict[str, Any]:
    data = load_pipeline("scripted-omni").model_dump(by_alias=True, exclude_none=True)
    if placement is not None:
        data["stages"][1]["placement"] = placement
    if cluster is not None:
        data["cluster"] = cluster
    return data


def test_a_placed_stage_runs_in_worker_processes() -> None:
    spec = PipelineSpec.model_validate(
        _with({"ray": {"num_cpus": 2, "resources": {"node_b": 1}}}, {"ray": {}})
    )
    talker = spec.stage("talker")
    assert talker.process
    assert talker.placement is not None
    assert talker.placement.ray.resources == {"node_b": 1}
    assert spec.cluster is not None
    assert spec.cluster.ray.address == "auto"
    assert spec.cluster.ray.strategy == "PACK"
    assert not spec.stage("thinker").process  # the others run as declared


@pytest.mark.parametrize(
    ("placement", "cluster", "message"),
    [
        ({"ray": {}}, None, "have a placement: declare the cluster"),
        ({"ray": {"resources": {"node_b": -1}}}, {"ray": {}}, "negative"),
        ({"ray": {"num_cpus": 0}}, {"ray": {}}, "asks for some CPU"),
        ({"ray": {"num_gpu": 1}}, {"ray": {}}, "num_gpu"),
        ({"kubernetes": {}}, {"ray": {}}, "kubernetes"),
        ({"ray": {}}, {"ray": {"strategy": "ANYWHERE"}}, "STRICT_SPREAD"),
        ({"ray": {}}, {"ray": {"address": ""}}, "address"),
    ],
)
def test_bad_scale_out_yaml_is_refused_by_name(
    placement: dict[str, Any], cluster: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises((PipelineConfigError, ValueError), match=message):
        PipelineSpec.model_validate(_with(placement, cluster))


def test_on_cluster_sets_the_address_and_keeps_the_rest() -> None:
    spec = PipelineSpec.model_validate(
        _with({"ray": {}}, {"ray": {"strategy": "STRICT_SPREAD", "namespace": "voice"}})
    )
    moved = spec.on_cluster("ray://head:10001")
    assert moved.cluster is not None
    assert moved.cluster.ray.address == "ray://head:10001"
    assert (moved.cluster.ray.strategy, moved.cluster.ray.namespace) == ("STRICT_SPREAD", "voice")
    with pytest.raises(PipelineConfigError, match="places no stage"):
        load_pipeline("scripted-omni").on_cluster("auto")
    with pytest.raises(ValueError, match="address"):
        spec.on_cluster("")


def test_off_cluster_keeps_placed_stages_in_local_workers() -> None:
    spec = PipelineSpec.model_validate(_with({"ray": {}}, {"ray": {}})).off_cluster()
    assert spec.cluster is None
    assert all(stage.placement is None for stage in spec.stages)
    assert spec.stage("talker").process


def test_without_ray_a_cluster_pipeline_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from omni_actors.cluster.ray_hosts import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ImportError, match=r"omni-actors\[ray\]"):
        import_ray()


def test_a_worker_host_needs_a_worker_process() -> None:
    with pytest.raises(ValueError, match="process=True"):
        Props(host=LOCAL)
    assert Props(process=True, host=LOCAL).host is LOCAL


def test_serve_on_a_cluster_needs_a_placed_stage(capsys: pytest.CaptureFixture[str]) -> None:
    from omni_actors.cli import main

    assert main(["serve", "--preset", "scripted-omni", "--cluster", "auto"]) == 2
    assert "places no stage" in capsys.readouterr().err
