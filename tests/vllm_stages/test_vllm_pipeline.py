"""The ``tiny-omni-vllm`` preset end to end: the thinker on vLLM in a worker process,
the torch talker and code2wav streaming behind it; and what a dead worker leaves.

One pipeline serves the module (vLLM starts in tens of seconds). Checks here are of
structure (text, audio, ordering, failure codes, processes), not of exact tokens: those
are ``test_vllm_thinker.py``'s, one session at a time.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from omni_actors.bench.models import fixed_replies
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import load_pipeline
from omni_actors.protocols.events import AudioDelta, Done, Event, ResponseDone, TextDelta
from omni_actors.testing import eventually
from omni_actors.testing.faults import kill_worker, worker_pid

pytestmark = pytest.mark.asyncio(loop_scope="module")

LONG_REPLY = 160


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(cache_dir: Path) -> AsyncIterator[OmniPipeline]:
    # Replies run to their max_tokens: the thinker must still be decoding when the
    # talker's first frame comes, however loaded the machine is (an early end of turn
    # would make that a race). Tests ask for fewer tokens where they need less.
    spec = fixed_replies(
        load_pipeline("tiny-omni-vllm").with_weights(cache_dir=cache_dir), LONG_REPLY
    )
    async with OmniPipeline(spec) as pipeline:
        # Warm: a stage's first request pays one-off costs (allocations, first forwards
        # in a fresh process) that say nothing about how the stages overlap.
        warm = [e async for e in pipeline.generate(text="warm up")]
        assert isinstance(warm[-1], Done), warm[-1]
        yield pipeline


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (zombies count as gone)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


async def test_text_in_text_and_audio_out_with_audio_before_the_thinker_ends(
    omni: OmniPipeline,
) -> None:
    async with omni.session() as session:
        await session.send(text="Hello there!")
        response = await session.respond(max_tokens=LONG_REPLY)
        events: list[Event] = [e async for e in response.events()]
    assert isinstance(events[-1], ResponseDone), events[-1]
    assert events[-1].status == "completed"
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text
    assert text.isprintable()
    assert any(isinstance(e, AudioDelta) for e in events)
    stages = events[-1].metrics.stages
    talker_first, thinker_last = stages["talker"].first_output_at, stages["thinker"].last_output_at
    assert talker_first is not None
    assert thinker_last is not None
    # The talker started on the thinker's first tokens: a codec frame before its last.
    assert talker_first < thinker_last


async def test_speech_in_text_and_audio_out(omni: OmniPipeline) -> None:
    tone = torch.sin(torch.arange(24_000) * 2 * math.pi * 220 / 16_000) * 0.3
    async with omni.session() as session:
        for piece in tone.split(1600):  # 100 ms microphone frames: one clip
            await session.send(audio=piece)
        response = await session.respond(max_tokens=12)
        events = [e async for e in response.events()]
    assert isinstance(events[-1], ResponseDone), events[-1]
    assert events[-1].status == "completed"
    assert "".join(e.text for e in events if isinstance(e, TextDelta))
    assert any(isinstance(e, AudioDelta) for e in events)


async def test_a_conversation_keeps_its_turns_across_responses(omni: OmniPipeline) -> None:
    async with omni.session() as session:
        texts = []
        for words in ("Hi", "And then?", "Bye"):
            await session.send(text=words)
            response = await session.respond(max_tokens=6)
            events = [e async for e in response.events()]
            assert isinstance(events[-1], ResponseDone), events[-1]
            assert events[-1].status == "completed"
            texts.append("".join(e.text for e in events if isinstance(e, TextDelta)))
        assert all(texts)


async def test_a_killed_vllm_worker_fails_its_session_leaves_no_process_and_restarts(
    cache_dir: Path,
) -> None:
    # A pipeline of its own: the restarted worker is this test's to stop.
    spec = load_pipeline("tiny-omni-vllm").with_weights(cache_dir=cache_dir)
    async with OmniPipeline(spec) as omni:
        await _kill_and_restart(omni)


async def _kill_and_restart(omni: OmniPipeline) -> None:
    thinker = (await omni.stages())["thinker"]
    first = worker_pid(thinker)
    # vLLM's EngineCore (which runs the model, on a CPU) is in the worker's process group.
    assert len(group_members(first)) >= 2
    async with omni.session() as victim:
        await victim.send(text="Talk to me", end="finished")
        events: list[Event] = []
        async for event in victim:
            events.append(event)
            if isinstance(event, TextDelta) and len(events) == 2:
                assert kill_worker(thinker, signal.SIGKILL) == first
    error = events[-1]
    assert getattr(error, "code", None) == "stage_failed", error

    async def group_gone() -> None:
        assert group_members(first) == []

    await eventually(group_gone, timeout=30)
    await omni.inspect(timeout=300)  # answered once a new worker has started vLLM
    assert worker_pid(thinker) != first
    after = [e async for e in omni.generate(text="Again?")]
    assert isinstance(after[-1], Done), after[-1]
    assert any(isinstance(e, AudioDelta) for e in after)
