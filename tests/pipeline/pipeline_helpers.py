"""Shared builders and checks for the pipeline tests (scripted engines, fast latencies)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.events import AudioDelta, Done, Event, TextDelta
from omni_actors.testing import ActorTestKit, eventually
from omni_actors.testing.inspection import actor_instance

THINKER = {"first_output_s": 0.005, "per_output_s": 0.001, "outputs": 8}
TALKER = {
    "first_output_s": 0.002,
    "per_output_s": 0.001,
    "outputs_per_input": 2,
    "fields": ["codes"],
}
CODE2WAV = {
    "first_output_s": 0.001,
    "per_output_s": 0.0005,
    "outputs_per_input": 1,
    "fields": ["audio"],
    "audio_samples": 240,
}


def make_spec(
    *,
    mode: str = "stream",
    thinker: dict[str, Any] | None = None,
    talker: dict[str, Any] | None = None,
    code2wav: dict[str, Any] | None = None,
    deadlines: dict[str, float] | None = None,
    process: tuple[str, ...] = (),
) -> PipelineSpec:
    """thinker -> talker -> code2wav with scripted engines; overrides merge into defaults."""
    window = {"chunk_policy": {"initial_frames": 4, "frames": 6, "left_context": 3}}
    return PipelineSpec.model_validate(
        {
            "name": "test-omni",
            "stages": [
                {
                    "name": name,
                    "engine": {"kind": "scripted", "args": {**base, **(over or {})}},
                    "process": name in process,
                }
                for name, base, over in (
                    ("thinker", THINKER, thinker),
                    ("talker", TALKER, talker),
                    ("code2wav", CODE2WAV, code2wav),
                )
            ],
            "edges": [
                {
                    "from": "thinker",
                    "to": "talker",
                    "mode": mode,
                    "fields": ["hidden", "token_ids"],
                },
                {
                    "from": "talker",
                    "to": "code2wav",
                    "mode": mode,
                    "fields": ["codes"],
                    **(window if mode == "stream" else {}),
                },
            ],
            "outputs": {"text": "thinker", "audio": "code2wav"},
            "supervision": {"backoff_min_s": 0.0, "backoff_max_s": 0.0},
            "deadlines": deadlines or {},
        }
    )


async def collect(events: AsyncIterator[Event]) -> list[Event]:
    """Every event of a stream."""
    return [event async for event in events]


def text_of(events: list[Event]) -> str:
    """The streamed text."""
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def samples_of(events: list[Event]) -> int:
    """The streamed audio length in samples."""
    return sum(e.audio.numel() for e in events if isinstance(e, AudioDelta))


def done(events: list[Event]) -> Done:
    """The final ``Done`` (fails the test with the events if the stream ended otherwise)."""
    last = events[-1] if events else None
    assert isinstance(last, Done), f"expected Done last, got {events[-3:]}"
    return last


async def assert_nothing_held(omni: OmniPipeline, timeout: float = 5.0) -> None:
    """No session is known to the orchestrator, held by a stage or running in an engine.

    Session actors stop right after their terminal event, and a stage frees an aborted
    session as its task ends: wait (``timeout`` at most) until all of that is done.
    """

    async def nothing_held() -> None:
        live = await omni.live_sessions()
        held = {name: state.keys for name, state in (await omni.inspect()).items()}
        engines = {
            name: sorted(engine.active_sessions)
            for name, ref in (await omni.stages()).items()
            if isinstance(instance := actor_instance(ref), StageActor)
            and (engine := instance.engine) is not None
            and hasattr(engine, "active_sessions")
        }
        assert not any(live.values()), f"orchestrator still knows {live}"
        assert not any(held.values()), f"stages still hold {held}"
        assert not any(engines.values()), f"engines still run {engines}"

    await eventually(nothing_held, timeout=timeout)


async def armed(kit: ActorTestKit, delay: float, count: int = 1) -> None:
    """``kit.armed``: until ``count`` deadlines are armed ``delay`` seconds from now."""
    await kit.armed(delay, count)
