"""Every wait has a deadline: admission, first chunk, inter-chunk, idle and total.

Each expiry ends the session with a ``SessionError`` (code ``timeout``, or
``admission``) that names the stage and the setting, and frees every stage.
"""

from __future__ import annotations

import asyncio

import pytest
from pipeline_helpers import assert_nothing_held, collect, make_spec

from omni_actors.actors.stage import StageActor
from omni_actors.protocols.control import Prewarm
from omni_actors.protocols.events import SessionError
from omni_actors.serving.omni_pipeline import OmniPipeline, SessionClosedError


def error_of(events: list[object]) -> SessionError:
    last = events[-1]
    assert isinstance(last, SessionError), f"expected a SessionError, got {events[-3:]}"
    return last


async def test_admission_deadline_when_every_slot_is_taken() -> None:
    spec = make_spec(deadlines={"admission_s": 0.2})
    async with OmniPipeline(spec, max_sessions=1) as omni:
        async with omni.session():
            loop = asyncio.get_running_loop()
            started = loop.time()
            error = error_of(await collect(omni.generate(text="x")))
            assert error.code == "admission"
            assert "max_sessions" in error.message
            assert 0.15 < loop.time() - started < 2.0
        # the slot is free again
        events = await collect(omni.generate(text="x"))
        assert not isinstance(events[-1], SessionError)
        await assert_nothing_held(omni)


async def test_a_session_handle_that_cannot_open_raises() -> None:
    spec = make_spec(deadlines={"admission_s": 0.1})
    async with OmniPipeline(spec, max_sessions=1) as omni, omni.session():
        with pytest.raises(SessionClosedError, match="could not open"):
            async with omni.session():
                pass


async def test_first_chunk_deadline_on_a_full_edge() -> None:
    # The full payload only leaves the thinker after 10 x 50 ms.
    spec = make_spec(
        mode="full",
        thinker={"per_output_s": 0.05, "outputs": 10},
        deadlines={"first_chunk_s": 0.2},
    )
    async with OmniPipeline(spec) as omni:
        error = error_of(await collect(omni.generate(text="x")))
        assert error.code == "timeout"
        assert error.stage in ("talker", "code2wav")
        assert "first_chunk_s" in error.message
        await assert_nothing_held(omni)


async def test_inter_chunk_deadline_on_a_stream_edge() -> None:
    spec = make_spec(
        thinker={"first_output_s": 0.0, "per_output_s": 0.4, "outputs": 4},
        deadlines={"inter_chunk_s": 0.15},
    )
    async with OmniPipeline(spec) as omni:
        events = await collect(omni.generate(text="x"))
        error = error_of(events)
        assert error.code == "timeout"
        assert error.stage == "talker"
        assert "inter_chunk_s" in error.message
        assert "DeadlineExceededError" in error.error_type
        await assert_nothing_held(omni)


async def test_idle_deadline_between_segments_of_a_resumable_session() -> None:
    spec = make_spec(deadlines={"idle_s": 0.2})
    async with OmniPipeline(spec) as omni:
        async with omni.session() as session:
            await session.send(text="hi")
            await session.end_segment()
            first = [e async for e in session.events()]
            assert not isinstance(first[-1], SessionError)
            # the caller never sends the next segment
            error = error_of([e async for e in session.events()])
        assert error.code == "timeout"
        assert "idle_s" in error.message
        await assert_nothing_held(omni)


async def test_total_deadline_ends_a_long_session() -> None:
    spec = make_spec(
        thinker={"first_output_s": 0.0, "per_output_s": 0.05, "outputs": 100},
        deadlines={"total_s": 0.3},
    )
    async with OmniPipeline(spec) as omni:
        loop = asyncio.get_running_loop()
        started = loop.time()
        error = error_of(await collect(omni.generate(text="x")))
        assert error.code == "timeout"
        assert "total_s" in error.message
        assert loop.time() - started < 2.0
        await assert_nothing_held(omni)


class SilentStage(StageActor):
    """Accepts prewarms but never runs the session: nothing would ever end it."""

    def _prewarm(self, message: Prewarm) -> bool:
        return True


async def test_the_caller_gets_a_timeout_even_if_no_stage_ends_the_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import omni_actors.serving.session

    monkeypatch.setattr(omni_actors.serving.session, "_GRACE_S", 0.05)
    spec = make_spec(deadlines={"total_s": 0.2})
    async with OmniPipeline(spec, stage_classes={"thinker": SilentStage}) as omni:
        error = error_of(await collect(omni.generate(text="x", modalities=("text",))))
        assert error.code == "timeout"
        assert "did not end it" in error.message
        await assert_nothing_held(omni)
