"""The realtime server on tiny-omni: what a client hears over the websocket is what the
library's ``Session`` makes of the same instructions and audio, barge-in cancels a
real reply, and an OpenAI voice name speaks as the speaker it maps to."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import openai
import pytest

pytest.importorskip("transformers")

import torch
from openai import AsyncOpenAI
from realtime_client import b64, connect, silence, speech

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD
from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.events import AudioDelta, ResponseDone, TextDelta
from omni_actors.server.runner import run_server
from omni_actors.server.settings import ServerSettings

pytestmark = pytest.mark.integration

FRAME = 480  # 20 ms at 24 kHz
INSTRUCTIONS = "Answer in one short sentence."


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> PipelineSpec:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-omni", cache_dir=root)
    return load_pipeline("tiny-omni").with_weights(cache_dir=root)


async def _library_reply(spec: PipelineSpec, pcm: bytes) -> tuple[str, torch.Tensor]:
    samples = torch.from_numpy(np.frombuffer(pcm, dtype="<i2").copy())
    async with OmniPipeline(spec) as omni, omni.session() as session:
        await session.send(fields={INSTRUCTIONS_FIELD: INSTRUCTIONS})
        for i in range(0, samples.numel(), FRAME):
            await session.send(audio=samples[i : i + FRAME], sample_rate=24_000)
        await session.commit()
        response = await session.respond()
        events = [e async for e in response.events()]
    assert isinstance(events[-1], ResponseDone)
    assert events[-1].status == "completed"
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    audio = torch.cat([e.audio for e in events if isinstance(e, AudioDelta)])
    return text, audio


async def test_the_server_says_what_the_library_says_and_barge_in_cancels(
    spec: PipelineSpec,
) -> None:
    pcm = speech(1.0, seed=3)
    serving = run_server(ServerSettings(port=0), pipeline=spec)
    async with serving as server, connect(server.ws_url) as client:
        await client.send(
            "session.update",
            session={
                "type": "realtime",
                "instructions": INSTRUCTIONS,
                "audio": {"input": {"turn_detection": None}},
            },
        )
        assert (await client.expect("session.updated"))["session"]["instructions"] == INSTRUCTIONS
        for i in range(0, len(pcm), 2 * FRAME):  # 20 ms frames, as a microphone sends
            await client.send("input_audio_buffer.append", audio=b64(pcm[i : i + 2 * FRAME]))
        await client.send("input_audio_buffer.commit")
        await client.send("response.create")
        events = await client.until("response.done", timeout=120)
        reply = events[-1]["response"]
        # Random weights speak to the preset's max_new_tokens (48): cut there, the reply
        # ends incomplete, as OpenAI's does at max_output_tokens.
        cut = reply["usage"]["output_tokens"] == 48
        assert reply["status"] == ("incomplete" if cut else "completed"), reply
        heard = b"".join(
            base64.b64decode(e["delta"])
            for e in events
            if e["type"] == "response.output_audio.delta"
        )
        transcript = next(
            e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"
        )

        # Barge-in on a real reply: server VAD back on, the user speaks over it.
        await client.send(
            "session.update",
            session={"type": "realtime", "audio": {"input": {"turn_detection": {}}}},
        )
        await client.expect("session.updated")
        await client.say(speech(0.6, seed=4) + silence(0.7), frame_s=0.02)
        await client.until("response.output_audio.delta", timeout=120)
        await client.say(speech(0.4, seed=5), frame_s=0.02)
        done = await client.until("response.done", timeout=120)
        assert done[-1]["response"]["status"] == "cancelled"
        assert done[-1]["response"]["status_details"]["reason"] == "turn_detected"

    text, audio = await _library_reply(spec, pcm)
    assert transcript == text
    ours = torch.from_numpy(np.frombuffer(heard, dtype="<i2").astype(np.int32))
    expected = (audio.clamp(-1, 1) * 32768).round().clamp(-32768, 32767).to(torch.int32)
    assert ours.numel() == expected.numel()
    assert (ours - expected).abs().max() <= 1  # PCM16 quantisation only


async def test_an_openai_voice_and_usage_on_tiny_omni(spec: PipelineSpec) -> None:
    """The real talker's speakers are learnt from the pipeline: an OpenAI voice speaks
    as the speaker it maps to, an unknown one is a 400, and usage is the thinker's."""
    async with run_server(ServerSettings(port=0), pipeline=spec) as server:
        voices = await server.state.voices()
        assert voices.speakers == ("aiden", "chelsie", "ethan")  # the release's
        client = AsyncOpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )

        async def ask(voice: str, messages: list[Any]) -> tuple[bytes, Any]:
            completion = await client.chat.completions.create(
                model="tiny-omni",
                messages=messages,
                modalities=["text", "audio"],
                audio={"voice": voice, "format": "pcm16"},  # type: ignore[typeddict-item]
            )
            audio = completion.choices[0].message.audio
            assert audio is not None
            return base64.b64decode(audio.data), completion.usage

        hello = [{"role": "user", "content": "hello"}]
        alloy, usage = await ask("alloy", hello)
        assert alloy
        speaker, _ = await ask(voices.speaker("alloy"), hello)
        assert alloy == speaker  # the same speaker, the same (greedy) speech
        assert usage.prompt_tokens > 0
        assert usage.completion_tokens > 0
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        _, instructed = await ask("alloy", [{"role": "system", "content": INSTRUCTIONS}, *hello])
        assert instructed.prompt_tokens > usage.prompt_tokens  # the system turn counts

        with pytest.raises(openai.BadRequestError) as refused:
            await ask("bogus", hello)
        assert isinstance(refused.value.body, dict)
        assert refused.value.body["param"] == "audio.voice"
