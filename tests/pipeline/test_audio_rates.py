"""Audio rates an engine author sets: the rate the caller sends at
(``generate(audio=..., sample_rate=...)``) and the rate an engine yields at
(``audio_rate``), which the pipeline's ``outputs.sample_rate`` follows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import pytest
import torch

from omni_actors.actors.engines.contract import Fields
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineConfigError
from omni_actors.protocols.events import AudioDelta, Done
from omni_actors.testing import engine_pipeline


class Echo:
    """Plays the caller's audio back, at the rate the pipeline takes it."""

    inputs: ClassVar[dict[str, str]] = {"audio": "concat"}
    outputs: ClassVar[dict[str, str]] = {"audio": "concat"}
    audio_rate = 16000

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        async for chunk in inputs:
            audio = chunk["audio"]
            assert isinstance(audio, torch.Tensor)
            yield {"audio": audio}


def test_the_pipeline_gives_audio_at_the_rate_its_engine_declares() -> None:
    spec = engine_pipeline(Echo)
    assert spec.inputs.sample_rate == 16000
    assert spec.outputs.sample_rate == 16000  # not the default 24000: played 1.5x fast


def test_an_outputs_sample_rate_that_contradicts_the_engine_is_refused() -> None:
    with pytest.raises(PipelineConfigError, match=r"outputs.sample_rate is 24000.*16000 Hz"):
        engine_pipeline(Echo, outputs={"audio": "engine", "sample_rate": 24000})


def test_audio_rate_must_be_a_rate() -> None:
    class Bad(Echo):
        audio_rate = 0

    from omni_actors.actors.engines.registry import EngineType, EngineUnavailableError, NoArgs

    with pytest.raises(EngineUnavailableError, match="audio_rate must be a positive int"):
        EngineType("bad", Bad, NoArgs).ports(NoArgs())


async def test_generate_takes_audio_at_the_callers_rate_and_echo_keeps_its_length() -> None:
    second_at_48k = torch.sin(torch.arange(48000, dtype=torch.float32) * 0.01) * 0.5
    async with OmniPipeline(engine_pipeline(Echo)) as omni:
        events = [e async for e in omni.generate(audio=second_at_48k, sample_rate=48000)]
    assert isinstance(events[-1], Done), events
    deltas = [e for e in events if isinstance(e, AudioDelta)]
    assert {e.sample_rate for e in deltas} == {16000}
    played_s = sum(e.audio.numel() for e in deltas) / 16000
    assert played_s == pytest.approx(1.0, abs=0.01)  # one second in, one second out
