"""Every wait has a deadline: admission, first chunk, inter-chunk, idle and total.

Each expiry ends the session with a ``SessionError`` (code ``timeout``, or
``admission``) that names the stage and the setting, and frees every stage. The
pipeline runs in a test kit with a virtual clock: a deadline expires when the test
advances time past it, never on its own, so nothing here waits real seconds and no
outcome depends on the machine's speed. (Stages run in this process here; a stage in a
worker process enforces its deadlines on that process's real clock.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest
import pytest_asyncio
from pipeline_helpers import armed, assert_nothing_held, collect, make_spec

from omni_actors.actors.engines.contract import Fields, output_overdue
from omni_actors.actors.engines.scripted import ScriptedEngine
from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import _GRACE_S
from omni_actors.pipeline.session_input import SessionClosedError
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.control import Prewarm
from omni_actors.protocols.events import AudioDelta, Event, ResponseDone, SessionError, TextDelta
from omni_actors.testing import ActorTestKit
from omni_actors.testing.inspection import actor_instance


@pytest_asyncio.fixture
async def kit() -> AsyncIterator[ActorTestKit]:
    async with ActorTestKit(virtual_time=True) as kit:
        yield kit


def error_of(events: list[Event]) -> SessionError:
    last = events[-1]
    assert isinstance(last, SessionError), f"expected a SessionError, got {events[-3:]}"
    return last


async def test_admission_deadline_when_every_slot_is_taken(kit: ActorTestKit) -> None:
    spec = make_spec(deadlines={"admission_s": 0.2})
    async with OmniPipeline(spec, max_sessions=1, system=kit.system) as omni:
        async with omni.session():
            request = asyncio.ensure_future(collect(omni.generate(text="x")))
            await armed(kit, 0.2)
            kit.virtual_clock.advance(0.19)
            await kit.consistently(lambda: not request.done(), duration=0.05)  # not yet
            kit.virtual_clock.advance(0.01)
            error = error_of(await request)
            assert error.code == "admission"
            assert "max_sessions" in error.message
        # the slot is free again
        events = await collect(omni.generate(text="x"))
        assert not isinstance(events[-1], SessionError)
        await assert_nothing_held(omni)


async def test_a_session_handle_that_cannot_open_raises(kit: ActorTestKit) -> None:
    spec = make_spec(deadlines={"admission_s": 0.1})
    async with OmniPipeline(spec, max_sessions=1, system=kit.system) as omni, omni.session():

        async def open_another() -> None:
            async with omni.session():
                pass

        opening = asyncio.ensure_future(open_another())
        await armed(kit, 0.1)
        kit.virtual_clock.advance(0.1)
        with pytest.raises(SessionClosedError, match="could not open"):
            await opening


async def test_first_chunk_deadline_on_a_full_edge(kit: ActorTestKit) -> None:
    # The thinker's first output comes at once (its own deadline is met), its end never.
    thinker = {"first_output_s": 0.0, "per_output_s": 3600.0, "outputs": 4}
    spec = make_spec(mode="full", thinker=thinker, deadlines={"first_chunk_s": 0.2})
    async with OmniPipeline(spec, system=kit.system) as omni:
        request = asyncio.ensure_future(collect(omni.generate(text="x")))
        # The thinker has its input (its own first-chunk wait is over)...
        thinker = actor_instance((await omni.stages())["thinker"])
        assert isinstance(thinker, StageActor)
        engine = thinker.engine
        assert isinstance(engine, ScriptedEngine)
        await kit.eventually(lambda: engine.active_sessions, what="the thinker generating")
        # ...while talker and code2wav still wait for theirs.
        await armed(kit, 0.2, count=2)
        kit.virtual_clock.advance(0.2)
        error = error_of(await request)
        assert error.code == "timeout"
        assert error.stage in ("talker", "code2wav")
        assert "first_chunk_s" in error.message
        await assert_nothing_held(omni)


class Hangs:
    """Says its input back, upper-cased; input ``hang`` makes it wait forever instead."""

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None:
        self.took: list[str] = []  # every input, as the engine took it
        self.overdue: list[bool] = []  # output_overdue, at each cancel

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        said = ""
        async for fields in inputs:
            said += str(fields["text"])
            self.took.append(str(fields["text"]))
        if said == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.overdue.append(output_overdue(inputs))
                raise
        yield {"text": said.upper()}


def hanging_spec(first_chunk_s: float) -> PipelineSpec:
    """A hanging entry stage, then a scripted one that voices its text."""
    speaker = {"outputs_per_input": 1, "fields": ["audio"], "audio_samples": 240}
    return PipelineSpec.model_validate(
        {
            "name": "hanging",
            "stages": [
                {"name": "entry", "engine": {"kind": "test_pipeline_deadlines:Hangs"}},
                {"name": "speaker", "engine": {"kind": "scripted", "args": speaker}},
            ],
            "edges": [{"from": "entry", "to": "speaker"}],
            "outputs": {"text": "entry", "audio": "speaker"},
            "deadlines": {"first_chunk_s": first_chunk_s},
        }
    )


async def test_a_reply_without_a_first_output_in_first_chunk_s_fails_alone(
    kit: ActorTestKit,
) -> None:
    async with OmniPipeline(hanging_spec(0.5), system=kit.system) as omni:
        async with omni.session() as session:
            for _ in range(2):  # every reply has the deadline, not only the first
                await session.send(text="hang")
                hung = await session.respond()
                await armed(kit, 0.5)  # from the last input the engine took
                kit.virtual_clock.advance(0.49)
                await kit.consistently(lambda r=hung: r.done is None, duration=0.05)  # not yet
                kit.virtual_clock.advance(0.01)
                done = await hung.wait()
                assert isinstance(done, ResponseDone), done
                assert (done.status, done.code, done.stage) == ("failed", "timeout", "entry")
                assert "first_chunk_s" in done.message
                assert "test_pipeline_deadlines:Hangs" in done.message
                # The session stays open: the next reply goes through every stage.
                await session.send(text="hi")
                events = [e async for e in (await session.respond()).events()]
                assert isinstance(events[-1], ResponseDone), events
                assert events[-1].status == "completed"
                assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "HI"
                assert any(isinstance(e, AudioDelta) for e in events)
        # The engine could tell each cancel for what it was: a reply late, not the end.
        entry = actor_instance((await omni.stages())["entry"])
        assert isinstance(entry, StageActor)
        assert isinstance(entry.engine, Hangs)
        assert entry.engine.overdue == [True, True]
        await assert_nothing_held(omni)


async def test_an_engine_waiting_for_input_owes_no_output(kit: ActorTestKit) -> None:
    async with OmniPipeline(hanging_spec(0.5), system=kit.system) as omni:
        entry = actor_instance((await omni.stages())["entry"])
        assert isinstance(entry, StageActor)
        engine = entry.engine
        assert isinstance(engine, Hangs)
        async with omni.session() as session:
            await session.send(text="h")
            await kit.eventually(lambda: engine.took == ["h"], what="the engine taking input")
            # The user pauses mid-turn, far longer than first_chunk_s: the engine waits
            # for its input meanwhile, and owes no output.
            kit.virtual_clock.advance(5.0)
            await session.send(text="i")
            events = [e async for e in (await session.respond()).events()]
            assert isinstance(events[-1], ResponseDone), events
            assert events[-1].status == "completed", events[-1]
            assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "HI"


async def test_inter_chunk_deadline_on_a_stream_edge(kit: ActorTestKit) -> None:
    # The thinker's first output comes at once, the second never.
    spec = make_spec(
        thinker={"first_output_s": 0.0, "per_output_s": 3600.0, "outputs": 4},
        deadlines={"inter_chunk_s": 0.15},
    )
    async with OmniPipeline(spec, system=kit.system) as omni:
        request = asyncio.ensure_future(collect(omni.generate(text="x")))
        await armed(kit, 0.15)  # the talker, after the thinker's first chunk
        kit.virtual_clock.advance(0.15)
        error = error_of(await request)
        assert error.code == "timeout"
        assert error.stage == "talker"
        assert "inter_chunk_s" in error.message
        assert "DeadlineExceededError" in error.error_type
        await assert_nothing_held(omni)


async def test_idle_deadline_between_segments_of_a_resumable_session(
    kit: ActorTestKit,
) -> None:
    spec = make_spec(deadlines={"idle_s": 0.2})
    async with OmniPipeline(spec, system=kit.system) as omni:
        async with omni.session() as session:
            await session.send(text="hi")
            await session.end_segment()
            first = [e async for e in session.events()]
            assert not isinstance(first[-1], SessionError)
            # the caller never sends the next segment
            await armed(kit, 0.2)
            kit.virtual_clock.advance(0.2)
            error = error_of([e async for e in session.events()])
        assert error.code == "timeout"
        assert "idle_s" in error.message
        await assert_nothing_held(omni)


async def test_total_deadline_ends_a_long_session(kit: ActorTestKit) -> None:
    spec = make_spec(
        thinker={"first_output_s": 0.0, "per_output_s": 3600.0, "outputs": 100},
        deadlines={"total_s": 0.3},
    )
    async with OmniPipeline(spec, system=kit.system) as omni:
        request = asyncio.ensure_future(collect(omni.generate(text="x")))
        await armed(kit, 0.3, count=3)  # each stage's total, from its prewarm
        kit.virtual_clock.advance(0.3)
        error = error_of(await request)
        assert error.code == "timeout"
        assert "total_s" in error.message
        await assert_nothing_held(omni)


class SilentStage(StageActor):
    """Accepts prewarms but never runs the session: nothing would ever end it."""

    def _prewarm(self, message: Prewarm) -> bool:
        return True


async def test_the_caller_gets_a_timeout_even_if_no_stage_ends_the_session(
    kit: ActorTestKit,
) -> None:
    # Admission far beyond the caller's deadline: on a busy machine the prewarms may
    # still be in flight when the clock jumps, and only the caller's deadline may fire.
    spec = make_spec(deadlines={"total_s": 0.2, "admission_s": 60.0})
    stages = {"thinker": SilentStage}
    async with OmniPipeline(spec, stage_classes=stages, system=kit.system) as omni:
        request = asyncio.ensure_future(collect(omni.generate(text="x", modalities=("text",))))
        await armed(kit, 0.2 + _GRACE_S)  # the caller's own, last-resort deadline
        kit.virtual_clock.advance(0.2 + _GRACE_S)
        error = error_of(await request)
        assert error.code == "timeout"
        assert "did not end it" in error.message
        await assert_nothing_held(omni)


class NeverStarts(StageActor):
    """A stage whose start never ends (an engine stuck loading its model)."""

    async def on_start(self) -> None:
        await asyncio.Event().wait()


async def test_a_stage_that_does_not_start_within_start_s_fails_the_pipeline_start() -> None:
    from omni_actors.errors import StartTimeoutError

    spec = make_spec(deadlines={"start_s": 0.2})
    pipeline = OmniPipeline(spec, stage_classes={"talker": NeverStarts})
    with pytest.raises(StartTimeoutError, match=r"talker.*0\.2s"):
        await pipeline.start()
    await pipeline.close()
