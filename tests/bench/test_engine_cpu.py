"""The engines' own CPU that ``bench pipeline`` subtracts to report the framework's."""

from __future__ import annotations

from typing import Any

import pytest

from omni_actors.actors.engines.scripted import ScriptedEngine
from omni_actors.bench.engine_cpu import engine_cpu_ms_per_request
from omni_actors.bench.pipeline import bench_spec
from omni_actors.pipeline.spec.pipeline import PipelineSpec


def _spec(stages: list[dict[str, Any]], edges: list[dict[str, Any]], audio: str) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": "sim", "stages": stages, "edges": edges, "outputs": {"audio": audio}}
    )


def _scripted(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "engine": {"kind": "scripted", "args": args}}


@pytest.mark.parametrize("mode", ["stream", "full"])
async def test_every_engine_of_the_chain_makes_every_output(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: dict[str, int] = {}
    original = ScriptedEngine.output

    def counted(self: ScriptedEngine, k: int) -> Any:
        fields = ",".join(self.args.fields)
        made[fields] = made.get(fields, 0) + 1
        return original(self, k)

    monkeypatch.setattr(ScriptedEngine, "output", counted)

    cpu_ms = await engine_cpu_ms_per_request(bench_spec(mode), concurrency=2, requests=3)

    assert cpu_ms is not None
    assert cpu_ms > 0
    # A warm-up and three requests; per request the thinker's 32 outputs, the talker's
    # two codec frames per token and code2wav's audio per frame.
    assert made == {"token_ids,hidden,text": 4 * 32, "codes": 4 * 64, "audio": 4 * 64}


async def test_a_stage_that_is_not_scripted_cannot_be_measured() -> None:
    spec = _spec(
        [
            _scripted("a", fields=["codes"]),
            {"name": "b", "engine": {"kind": "qwen3-omni.code2wav"}},
        ],
        [{"from": "a", "to": "b"}],
        audio="b",
    )

    assert await engine_cpu_ms_per_request(spec, concurrency=1, requests=1) is None


async def test_a_stage_fed_by_two_stages_cannot_be_measured() -> None:
    audio = _scripted("c", outputs_per_input=1, fields=["audio"])
    spec = _spec(
        [_scripted("a"), _scripted("b", outputs_per_input=1, fields=["codes"]), audio],
        [{"from": "a", "to": "b"}, {"from": "a", "to": "c"}, {"from": "b", "to": "c"}],
        audio="c",
    )

    assert await engine_cpu_ms_per_request(spec, concurrency=1, requests=1) is None


async def test_an_engine_declared_to_fail_cannot_be_measured() -> None:
    spec = _spec(
        [
            _scripted("a", outputs=4),
            _scripted("b", outputs_per_input=1, fields=["audio"], fail_after=2),
        ],
        [{"from": "a", "to": "b"}],
        audio="b",
    )

    assert await engine_cpu_ms_per_request(spec, concurrency=2, requests=4) is None
