"""Testing one engine: ``engine_pipeline`` (no YAML), ``kit.armed`` before moving the
virtual clock, and a pipeline given as a mapping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest

from omni_actors.actors.engines.contract import Fields
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineConfigError
from omni_actors.protocols.events import Done, ResponseDone, TextDelta
from omni_actors.testing import ActorTestKit, engine_pipeline


class Upper:
    """Says its input back, upper-cased; ``hang`` makes it wait forever instead."""

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        said = "".join([str(fields["text"]) async for fields in inputs])
        if said == "hang":
            await asyncio.Event().wait()
        yield {"text": said.upper()}


async def test_engine_pipeline_drives_one_engine_without_yaml() -> None:
    spec = engine_pipeline(Upper)
    assert (spec.outputs.text, spec.outputs.audio) == ("engine", None)
    async with OmniPipeline(spec) as omni:
        events = [event async for event in omni.generate(text="hi")]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "HI"
    assert isinstance(events[-1], Done), events


async def test_a_test_waits_for_the_deadline_to_be_armed_before_advancing(
    virtual_testkit: ActorTestKit,
) -> None:
    kit = virtual_testkit
    spec = engine_pipeline(Upper, deadlines={"first_chunk_s": 6})
    async with OmniPipeline(spec, system=kit.system) as omni, omni.session() as session:
        await session.send(text="hang")
        response = await session.respond()
        await kit.armed(6)  # advancing before the wait began would move nothing
        kit.virtual_clock.advance(6)
        done = await asyncio.wait_for(response.wait(), 10)
    assert isinstance(done, ResponseDone), done
    assert (done.status, done.code) == ("failed", "timeout")


async def test_armed_names_the_deadlines_it_saw(virtual_testkit: ActorTestKit) -> None:
    virtual_testkit.virtual_clock.call_later(2.0, lambda: None)
    with pytest.raises(AssertionError, match=r"\[2\.0\]"):
        await virtual_testkit.armed(6, timeout=0.05)


def test_engine_pipeline_refuses_what_a_yaml_file_would() -> None:
    with pytest.raises(PipelineConfigError, match=r"stages\[engine\]\.engine\.args\.gian"):
        engine_pipeline("scripted", {"gian": 0.8})


async def test_a_pipeline_may_be_given_as_a_mapping() -> None:
    stage = {"name": "upper", "engine": {"kind": f"{__name__}:Upper"}}
    async with OmniPipeline(
        {"name": "upper", "stages": [stage], "outputs": {"text": "upper"}}
    ) as omni:
        events = [event async for event in omni.generate(text="ok")]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "OK"
