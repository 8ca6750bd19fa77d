"""An engine's ``eager_steps`` (the steps it ran eager although it replays CUDA graphs)
reaches a stage's ``Inspect`` answer and ``OmniPipeline.health()``, beside ``busy_s``;
an engine that does not tell, or tells something else than a count, reports None. So
do a step loop's ``step_counts`` (``bench pipeline`` reads them through a pipeline of
torch engines)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

from omni_actors.actors.engines.contract import Fields, engine_eager_steps, engine_step_counts
from omni_actors.actors.engines.torch_engine import TorchEngine
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.protocols.control import StepCounts
from omni_actors.protocols.events import Done
from omni_actors.testing import engine_pipeline


class FallsBack:
    """Each reply runs one step eager, as a graphed engine past its largest graph does."""

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None:
        self.eager_steps = 0

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        said = "".join([str(fields["text"]) async for fields in inputs])
        self.eager_steps += 1
        yield {"text": said}


async def _reply(omni: OmniPipeline, text: str) -> None:
    events = [event async for event in omni.generate(text=text)]
    assert isinstance(events[-1], Done), events


async def test_health_reports_each_stage_s_eager_steps() -> None:
    async with OmniPipeline(engine_pipeline(FallsBack)) as omni:
        assert (await omni.health()).stages["engine"].eager_steps == 0
        await _reply(omni, "a")
        await _reply(omni, "b")
        assert (await omni.health()).stages["engine"].eager_steps == 2


async def test_a_scripted_pipeline_reports_none() -> None:
    async with OmniPipeline("scripted-omni") as omni:
        health = await omni.health()
    assert {stage.eager_steps for stage in health.stages.values()} == {None}
    assert {stage.steps for stage in health.stages.values()} == {None}  # no step loops
    assert {stage.links for stage in health.stages.values()} == {None}  # no device links


def test_only_a_count_is_reported() -> None:
    class Odd:
        eager_steps = True  # not a count

    class Counted:
        eager_steps = 3

    assert engine_eager_steps(Odd()) is None
    assert engine_eager_steps(object()) is None
    assert engine_eager_steps(Counted()) == 3


def test_a_torch_engine_without_graphs_reports_none() -> None:
    assert engine_eager_steps(TorchEngine(Path("unused"), "plain")) is None


def test_only_step_counts_are_reported() -> None:
    counts = StepCounts(
        steps=2,
        decode_rows=1,
        prefill_tokens=5,
        prefill_steps=1,
        step_s=0.5,
        prefill_step_s=0.3,
        prefill_works=1,
        prefill_wait_s=0.1,
        decode_wait_s=0.0,
    )

    class Counted:
        step_counts = counts

    class Odd:
        step_counts = "2 steps"  # not the protocol's counts

    assert engine_step_counts(Counted()) is counts
    assert engine_step_counts(Odd()) is None
    assert engine_step_counts(object()) is None
