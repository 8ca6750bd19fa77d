"""Many concurrent sessions on one pipeline, with nothing left behind afterwards."""

from __future__ import annotations

import asyncio
import contextlib

from pipeline_helpers import assert_nothing_held, collect, done, make_spec, samples_of

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.protocols.events import AudioDelta, Event
from omni_actors.testing import ActorTestKit


async def aborted_after_first_audio(omni: OmniPipeline) -> list[Event]:
    seen: list[Event] = []
    async with contextlib.aclosing(omni.generate(text="x")) as events:
        async for event in events:
            seen.append(event)
            if isinstance(event, AudioDelta):
                break
    return seen


async def test_a_hundred_concurrent_sessions_leave_nothing_behind() -> None:
    tasks_before = len(asyncio.all_tasks())
    async with (
        ActorTestKit() as kit,
        OmniPipeline(make_spec(), max_sessions=100, system=kit.system) as omni,
    ):
        full = [collect(omni.generate(text=f"q{i}")) for i in range(60)]
        text = [collect(omni.generate(text="t", modalities=("text",))) for _ in range(20)]
        cut = [aborted_after_first_audio(omni) for _ in range(20)]
        results = await asyncio.gather(*full, *text, *cut)
        for events in results[:60]:
            assert samples_of(events) == 16 * 240
            done(events)
        for events in results[60:80]:
            assert samples_of(events) == 0
            done(events)
        for events in results[80:]:
            assert isinstance(events[-1], AudioDelta)
        await assert_nothing_held(omni)
        # every session actor has stopped: only the pipeline's own actors remain
        assert not [path for path in kit.live_actors() if "/session-" in path]
    assert len(asyncio.all_tasks()) <= tasks_before


async def test_more_sessions_than_slots_queue_for_admission() -> None:
    async with OmniPipeline(make_spec(), max_sessions=4) as omni:
        results = await asyncio.gather(*(collect(omni.generate(text="x")) for _ in range(24)))
        assert all(samples_of(events) == 16 * 240 for events in results)
        await assert_nothing_held(omni)
