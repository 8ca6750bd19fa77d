"""``OmniPipeline.health()``: every stage's state, restarts, sessions and backlog.

What a readiness probe and the server's metrics read: the orchestrator reports each
stage as its supervisor sees it (running, or restarting after a failure, and how often
it failed), and each running stage its backlog of input chunks.
"""

from __future__ import annotations

from typing import Any

from pipeline_helpers import collect, done, make_spec

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.control import PipelineHealth, StageHealth
from omni_actors.testing import eventually
from omni_actors.testing.chunk_faults import PipelineFaults

PATIENT = {"first_chunk_s": 30.0, "inter_chunk_s": 30.0, "idle_s": 30.0}


def with_backoff(spec: PipelineSpec, backoff_s: float) -> PipelineSpec:
    """``spec`` whose failed stages wait ``backoff_s`` before their restart."""
    data: dict[str, Any] = spec.model_dump(by_alias=True)
    data["supervision"] = {"backoff_min_s": backoff_s, "backoff_max_s": backoff_s}
    return PipelineSpec.model_validate(data)


def idle(stage: str, restarts: int = 0) -> StageHealth:
    return StageHealth(stage=stage, state="running", restarts=restarts, sessions=0, queued=0)


async def test_a_started_pipeline_is_ready_with_every_stage_idle() -> None:
    async with OmniPipeline(make_spec()) as omni:
        health = await omni.health()
        assert health == PipelineHealth(
            stages={name: idle(name) for name in ("thinker", "talker", "code2wav")}
        )
        assert health.ready


async def test_sessions_and_backlog_are_reported_per_stage() -> None:
    # The thinker's 8 outputs come at once; the talker takes 0.1 s for each: they queue.
    spec = make_spec(talker={"per_output_s": 0.05}, deadlines=PATIENT)
    async with OmniPipeline(spec) as omni:
        async with omni.session() as voiced, omni.session(modalities=("text",)) as texted:
            health = await omni.health()
            sessions = {name: s.sessions for name, s in health.stages.items()}
            assert sessions == {"thinker": 2, "talker": 1, "code2wav": 1}  # text: thinker only

            await voiced.send(text="x", end="finished")

            async def talker_backlog() -> int:
                queued = (await omni.health()).stages["talker"].queued
                assert queued is not None
                return queued

            assert await eventually(talker_backlog) > 0
            await texted.finish()
            done(await collect(voiced.__aiter__()))
            done(await collect(texted.__aiter__()))

        async def drained() -> None:
            health = await omni.health()
            assert health.stages == {n: idle(n) for n in health.stages}, health

        await eventually(drained)


async def test_a_crashed_stage_is_restarting_until_its_restart() -> None:
    # The talker crashes on its 3rd message (prewarm, a chunk, then the crash), once;
    # its supervisor restarts it a second later.
    faults = PipelineFaults(crash_after={"talker": 2})
    spec = with_backoff(make_spec(deadlines=PATIENT), backoff_s=1.0)
    async with OmniPipeline(spec, **faults.hooks()) as omni:
        failed = await collect(omni.generate(text="x"))
        assert failed[-1].code == "stage_failed"  # type: ignore[union-attr]

        async def restarting() -> PipelineHealth:
            health = await omni.health()
            assert health.stages["talker"].state == "restarting", health
            return health

        health = await eventually(restarting)
        assert health.stages["talker"].restarts == 1
        assert health.stages["talker"].queued is None  # not asked while restarting
        assert (health.stages["thinker"].state, health.stages["thinker"].restarts) == (
            "running",
            0,
        )
        assert not health.ready

        async def ready() -> PipelineHealth:
            health = await omni.health()
            assert health.ready, health
            return health

        health = await eventually(ready)
        assert health.stages["talker"] == idle("talker", restarts=1)
        assert health.stages["code2wav"].restarts == 0
        done(await collect(omni.generate(text="x")))  # served by the new instance


async def test_a_stage_failing_to_answer_is_reported_without_its_backlog() -> None:
    # The talker's first message is the health probe's Inspect: it crashes on it.
    faults = PipelineFaults(crash_after={"talker": 0})
    async with OmniPipeline(make_spec(), **faults.hooks()) as omni:
        health = await omni.health()
        assert health.stages["talker"].queued is None
        assert health.stages["thinker"] == idle("thinker")

        async def counted() -> None:
            assert (await omni.health()).stages["talker"] == idle("talker", restarts=1)

        await eventually(counted)
