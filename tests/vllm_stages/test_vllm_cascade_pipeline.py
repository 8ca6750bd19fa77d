"""The ``tiny-cascade-vllm`` preset end to end: the recognizer, the LLM on vLLM in a
worker process, the synthesizer and the decoder streaming behind it.

One pipeline serves the module (vLLM starts in tens of seconds). Checks here are of
structure (text, audio, a conversation, a barge-in), not of exact tokens: those are
``test_vllm_cascade_llm.py``'s.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import load_pipeline
from omni_actors.protocols.events import AudioDelta, Done, Event, ResponseDone, TextDelta

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("weights")
    prepare("tiny-cascade", cache_dir=where)
    return where


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cascade(cache: Path) -> AsyncIterator[OmniPipeline]:
    spec = load_pipeline("tiny-cascade-vllm").with_weights(cache_dir=cache)
    assert spec.stage("llm").engine.kind == "cascade.llm-vllm"
    async with OmniPipeline(spec) as pipeline:
        yield pipeline


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def audio_of(events: list[Event]) -> torch.Tensor:
    pieces = [e.audio for e in events if isinstance(e, AudioDelta)]
    return torch.cat(pieces) if pieces else torch.zeros(0)


def tone(seconds: float) -> torch.Tensor:
    return torch.sin(torch.arange(int(16000 * seconds)) * 2 * math.pi * 330 / 16000) * 0.3


async def test_text_in_text_and_audio_out(cascade: OmniPipeline) -> None:
    events = [e async for e in cascade.generate(text="Hello, who are you?")]
    assert isinstance(events[-1], Done), events[-1]
    text, audio = text_of(events), audio_of(events)
    assert text
    assert set(text) <= set("abcdefghijklmnopqrstuvwxyz ,.")  # the preset's allowed ids
    assert audio.numel() > 0
    assert bool(torch.isfinite(audio).all())
    assert events[-1].metrics.ttfa_ms is not None


async def test_a_voice_conversation_with_barge_in(cascade: OmniPipeline) -> None:
    async with cascade.session() as session:
        for piece in tone(0.5).split(1600):  # 100 ms microphone frames
            await session.send(audio=piece)
        await session.end_segment()
        first = [e async for e in session.events()]
        assert isinstance(first[-1], ResponseDone), first[-1]
        assert first[-1].status == "completed"
        assert text_of(first)
        assert audio_of(first).numel() > 0
        # The caller speaks over the second reply: it is cancelled on every stage.
        for piece in tone(0.3).split(1600):
            await session.send(audio=piece)
        second = await session.end_segment()
        async for event in session.events():
            if isinstance(event, AudioDelta):
                break
        assert await session.cancel_response(second)
        rest = [e async for e in session.events()]
        assert isinstance(rest[-1], ResponseDone), rest[-1]
        assert rest[-1].status == "cancelled"
        # ... and the conversation goes on, on the LLM's request reopened.
        await session.send(text="And now?")
        await session.finish()
        last = [e async for e in session.events()]
        assert isinstance(last[-1], Done), last[-1]
        assert text_of(last)
        assert audio_of(last).numel() > 0
