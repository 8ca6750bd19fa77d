"""Abort at every phase reaches every stage, frees every session's state, and ends the
caller's stream at once with a terminal event.

The slow stages here never produce within a test's life: an abort that waited for them
instead of interrupting them would leave the session held, and the test would fail.
"""

from __future__ import annotations

import asyncio
import contextlib

from pipeline_helpers import armed, assert_nothing_held, collect, done, make_spec

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.protocols.events import Aborted, AudioDelta, Event, TextDelta
from omni_actors.testing import ActorTestKit, eventually

SLOW_PREFILL = {"first_output_s": 3600.0}
SLOW_AUDIO = {"first_output_s": 0.0, "per_output_s": 3600.0}


async def wait_prewarmed(omni: OmniPipeline, stages: int = 3) -> None:
    """Until a session is held by ``stages`` stages."""

    async def prewarmed() -> bool:
        held = await omni.inspect()
        return sum(1 for state in held.values() if state.keys) >= stages

    await eventually(prewarmed, what=f"a session prewarmed on {stages} stages")


async def test_cancelling_a_request_waiting_for_admission() -> None:
    spec = make_spec(deadlines={"admission_s": 30.0})
    async with (
        ActorTestKit(virtual_time=True) as kit,
        OmniPipeline(spec, max_sessions=1, system=kit.system) as omni,
    ):
        async with omni.session() as holder:
            events = omni.generate(text="x")
            waiting = asyncio.ensure_future(anext(events))
            await armed(kit, 30.0)  # queued for a slot, its admission deadline armed
            assert not waiting.done()
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await events.aclose()
            await holder.abort()
        # the cancelled request took no slot with it
        done(await collect(omni.generate(text="x")))
        await assert_nothing_held(omni)


async def test_abort_mid_prefill_is_prompt_and_frees_every_stage() -> None:
    async with OmniPipeline(make_spec(thinker=SLOW_PREFILL)) as omni:
        async with omni.session() as session:
            await session.send(text="x")
            await session.finish()
            await wait_prewarmed(omni)
            await session.abort("changed my mind")
            events = [e async for e in session]
        assert events == [Aborted(session=session.id, reason="changed my mind")]
        await assert_nothing_held(omni)


async def test_cancelling_the_consumer_task_mid_prefill() -> None:
    async with OmniPipeline(make_spec(thinker=SLOW_PREFILL)) as omni:
        events = omni.generate(text="x")
        consumer = asyncio.ensure_future(collect(events))
        await wait_prewarmed(omni)
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await events.aclose()
        await assert_nothing_held(omni)


async def test_closing_the_stream_mid_audio() -> None:
    async with OmniPipeline(make_spec(code2wav=SLOW_AUDIO)) as omni:
        seen: list[Event] = []
        async with contextlib.aclosing(omni.generate(text="x")) as events:
            async for event in events:
                seen.append(event)
                if isinstance(event, AudioDelta):
                    break
        assert sum(isinstance(e, AudioDelta) for e in seen) == 1
        await assert_nothing_held(omni)


async def test_abort_while_finishing_after_the_thinker_is_done() -> None:
    async with OmniPipeline(make_spec(code2wav=SLOW_AUDIO)) as omni:
        async with omni.session() as session:
            await session.send(text="x")
            await session.finish()
            texts = 0
            async for event in session:
                texts += isinstance(event, TextDelta)
                if texts == 8:  # the thinker has finished; audio is still being made
                    await session.abort("barge-in")
            assert isinstance(event, Aborted)
            assert event.reason == "barge-in"
        await assert_nothing_held(omni)


async def test_abort_from_another_task_ends_the_consumers_stream_at_once() -> None:
    async with OmniPipeline(make_spec(thinker=SLOW_PREFILL)) as omni:
        async with omni.session() as session:
            await session.send(text="x")
            await session.finish()
            consumer = asyncio.ensure_future(collect(aiter(session)))
            await wait_prewarmed(omni)
            await session.abort()
            events = await asyncio.wait_for(consumer, 5.0)
        assert [type(e) for e in events] == [Aborted]
        await assert_nothing_held(omni)


async def test_abort_after_done_changes_nothing() -> None:
    async with OmniPipeline(make_spec()) as omni:
        async with omni.session() as session:
            await session.send(text="x")
            await session.finish()
            events = [e async for e in session]
            await session.abort()
        assert session.channel.terminal is done(events)
        await assert_nothing_held(omni)


async def test_closing_the_pipeline_ends_open_sessions_with_an_error() -> None:
    omni = OmniPipeline(make_spec(thinker=SLOW_PREFILL))
    async with omni:
        session = omni.session()
        await session.open()
        await session.send(text="x", end="finished")
    events = [e async for e in session]
    assert events[-1].code == "internal"  # type: ignore[union-attr]
    await session.close()
