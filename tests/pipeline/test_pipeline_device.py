"""Device placement in the pipeline YAML: a stage's ``device`` reaches its engine as the
engine's ``device`` argument; engines that take none refuse it by name; the CLI's
``--device`` places every stage that can be placed; the CPU path is what it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import yaml

from omni_actors.actors.engines.qwen3_omni.code2wav_engine import Code2WavArgs
from omni_actors.actors.engines.scripted import ScriptedArgs, ScriptedEngine
from omni_actors.actors.engines.torch_engine import resolve_device
from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.spec.pipeline import PipelineConfigError, load_pipeline


def _tiny(**stage: Any) -> dict[str, Any]:
    return {
        "name": "p",
        "stages": [{"name": "code2wav", "engine": {"kind": "qwen3-omni.code2wav"}, **stage}],
        "outputs": {"audio": "code2wav"},
    }


def _load(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_pipeline(path)


def test_a_stage_device_becomes_its_engine_device_argument(tmp_path: Path) -> None:
    staging = {"slots": 4, "slot_bytes": 1 << 20, "link_slots": 64}
    spec = _load(tmp_path, _tiny(device="cuda:1", staging=staging))
    stage = spec.stage("code2wav")
    assert stage.engine.args["device"] == "cuda:1"
    assert Code2WavArgs.model_validate(stage.engine.args).device == "cuda:1"
    assert (stage.staging.slots, stage.staging.slot_bytes) == (4, 1 << 20)
    assert stage.staging.link_slots == 64
    assert _load(tmp_path, _tiny()).stage("code2wav").staging.link_slots == 32


def test_without_a_device_the_engine_keeps_its_default(tmp_path: Path) -> None:
    spec = _load(tmp_path, _tiny())
    assert "device" not in spec.stage("code2wav").engine.args
    assert Code2WavArgs.model_validate({}).device == "cpu"


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        ({"device": "gpu"}, r"stages\[code2wav\]\.device: String should match"),
        ({"device": "cuda:x"}, r"stages\[code2wav\]\.device"),
        (
            {
                "device": "cpu",
                "engine": {"kind": "qwen3-omni.code2wav", "args": {"device": "cuda"}},
            },
            "contradicts engine.args.device",
        ),
        ({"staging": {"slots": 0}}, r"staging\.slots"),
        ({"staging": {"link_slots": 0}}, r"staging\.link_slots"),
    ],
)
def test_bad_placements_are_named(tmp_path: Path, stage: dict[str, Any], message: str) -> None:
    with pytest.raises(PipelineConfigError, match=message):
        _load(tmp_path, _tiny(**stage))


def test_an_engine_that_takes_no_device_refuses_one_by_name(tmp_path: Path) -> None:
    data = {
        "name": "p",
        "stages": [{"name": "thinker", "engine": {"kind": "scripted"}, "device": "cuda"}],
        "outputs": {"text": "thinker"},
    }
    with pytest.raises(PipelineConfigError, match=r"stages\[thinker\]\.device: engine 'scripted'"):
        _load(tmp_path, data)


def test_on_device_places_every_stage_that_takes_a_device() -> None:
    spec = load_pipeline("tiny-omni").on_device("auto")
    assert {s.name: s.device for s in spec.stages} == dict.fromkeys(
        ("thinker", "talker", "code2wav", "transcriber"), "auto"
    )
    assert all(s.engine.args["device"] == "auto" for s in spec.stages)
    with pytest.raises(PipelineConfigError, match="expected cpu, cuda, cuda:N or auto"):
        load_pipeline("tiny-omni").on_device("tpu")
    with pytest.raises(PipelineConfigError, match="no stage's engine takes a device"):
        load_pipeline("scripted-omni").on_device("cuda")


def test_auto_is_the_cpu_here_and_cuda_is_refused_without_it() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="no CUDA"):
        resolve_device("cuda")


async def test_a_cpu_stage_has_no_transfers() -> None:
    from omni_actors import ActorSystem
    from omni_actors.testing.inspection import actor_instance

    async with ActorSystem() as system:
        ref = await system.spawn(StageActor, "s", "scripted", {})
        stage = actor_instance(ref)
        assert isinstance(stage, StageActor)
        assert stage.transfers is None


class PlacedArgs(ScriptedArgs):
    device: str = "cpu"


class PlacedEngine(ScriptedEngine):
    """A scripted engine that takes a device, as the GPU engines do."""

    kind: ClassVar[str] = "placed"
    Args: ClassVar[type[ScriptedArgs]] = PlacedArgs


def test_devices_places_each_replica(tmp_path: Path) -> None:
    spec = _load(tmp_path, _tiny(devices=["cpu", "auto"]))
    stage = spec.stage("code2wav")
    assert stage.replicas == 2
    assert stage.replica_names() == ["code2wav-0", "code2wav-1"]
    assert stage.replica_devices() == ["cpu", "auto"]
    assert "device" not in stage.engine.args
    assert [stage.replica_args(i)["device"] for i in range(2)] == ["cpu", "auto"]
    assert not stage.computes_on_gpu()  # one replica is on the CPU
    # auto is a GPU where there is one (its device link offer finds out)
    assert _load(tmp_path, _tiny(devices=["auto", "cuda:1"])).stage("code2wav").computes_on_gpu()
    assert not _load(tmp_path, _tiny(devices=["cpu", "cuda:1"])).stage("code2wav").computes_on_gpu()
    assert _load(tmp_path, _tiny(devices=["cuda:0"], replicas=1)).stage("code2wav").replicas == 1


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        ({"devices": ["cpu"], "device": "cpu"}, "device and devices are both set"),
        ({"devices": ["cpu", "cpu"], "replicas": 3}, "replicas is 3 but devices names 2"),
        (
            {
                "devices": ["cpu"],
                "engine": {"kind": "qwen3-omni.code2wav", "args": {"device": "cuda"}},
            },
            "engine.args.device cannot be set too",
        ),
        ({"devices": []}, r"stages\[code2wav\]\.devices"),
        ({"devices": ["cuda:0", "gpu"]}, r"stages\[code2wav\]\.devices\[1\]: String should match"),
    ],
)
def test_bad_replica_placements_are_named(
    tmp_path: Path, stage: dict[str, Any], message: str
) -> None:
    with pytest.raises(PipelineConfigError, match=message):
        _load(tmp_path, _tiny(**stage))


def test_an_engine_that_takes_no_device_refuses_devices_by_name(tmp_path: Path) -> None:
    data = {
        "name": "p",
        "stages": [{"name": "thinker", "engine": {"kind": "scripted"}, "devices": ["cpu"]}],
        "outputs": {"text": "thinker"},
    }
    with pytest.raises(PipelineConfigError, match=r"stages\[thinker\]\.devices: engine 'scripted'"):
        _load(tmp_path, data)


def test_on_device_replaces_each_replicas_device(tmp_path: Path) -> None:
    spec = _load(tmp_path, _tiny(devices=["cuda:0", "cuda:1"])).on_device("cpu")
    stage = spec.stage("code2wav")
    assert (stage.devices, stage.replicas, stage.replica_devices()) == (None, 2, ["cpu", "cpu"])
    assert stage.engine.args["device"] == "cpu"


async def test_each_replica_is_spawned_with_its_own_device() -> None:
    from omni_actors.pipeline.omni_pipeline import OmniPipeline
    from omni_actors.pipeline.spec.pipeline import PipelineSpec
    from omni_actors.testing.inspection import actor_instance

    spec = PipelineSpec.model_validate(
        {
            "name": "p",
            "stages": [
                {
                    "name": "thinker",
                    "engine": {
                        "kind": f"{__name__}:PlacedEngine",
                        "args": {"outputs_per_input": 1, "fields": ["text"]},
                    },
                    "devices": ["cpu", "auto"],
                }
            ],
            "outputs": {"text": "thinker"},
        }
    )
    async with OmniPipeline(spec) as omni:
        stages = await omni.stages()
        assert sorted(stages) == ["thinker-0", "thinker-1"]
        placed = {}
        for name, ref in stages.items():
            stage = actor_instance(ref)
            assert isinstance(stage, StageActor)
            assert isinstance(stage.engine, PlacedEngine)
            placed[name] = stage.engine.args.device  # type: ignore[attr-defined]
        assert placed == {"thinker-0": "cpu", "thinker-1": "auto"}
