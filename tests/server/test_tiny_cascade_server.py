"""The realtime server and chat completions on tiny-cascade: a spoken conversation with
barge-in through the official ``openai`` client's wire, as on tiny-omni, and the
caller's transcripts, which the recognizer (the entry stage) makes."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence

import pytest
import torch

pytest.importorskip("transformers")

from openai import AsyncOpenAI
from realtime_client import b64, connect, silence, speech

from omni_actors.actors.engines.asr.engine import AsrArgs
from omni_actors.actors.engines.cascade.recognizer import RecognizerEngine
from omni_actors.actors.engines.contract import Fields
from omni_actors.audio.resample import CallerAudio
from omni_actors.models.cache import prepare
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.stage import SessionKey
from omni_actors.server.runner import run_server
from omni_actors.server.settings import ServerSettings

pytestmark = pytest.mark.integration

FRAME = 480  # 20 ms at 24 kHz


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> PipelineSpec:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-cascade", cache_dir=root)
    return load_pipeline("tiny-cascade").with_weights(cache_dir=root)


async def test_a_spoken_conversation_with_barge_in(spec: PipelineSpec) -> None:
    pcm = speech(1.0, seed=3)
    async with (
        run_server(ServerSettings(port=0), pipeline=spec) as server,
        connect(server.ws_url) as client,
    ):
        await client.send(
            "session.update",
            session={
                "type": "realtime",
                "instructions": "Answer briefly.",
                "audio": {"input": {"turn_detection": None}},
            },
        )
        await client.expect("session.updated")
        for i in range(0, len(pcm), 2 * FRAME):
            await client.send("input_audio_buffer.append", audio=b64(pcm[i : i + 2 * FRAME]))
        await client.send("input_audio_buffer.commit")
        await client.send("response.create")
        events = await client.until("response.done", timeout=120)
        reply = events[-1]["response"]
        assert reply["status"] in ("completed", "incomplete"), reply
        assert reply["usage"]["input_tokens"] > 0  # the LLM's prompt: it writes the reply
        # Transcription is off (as OpenAI's default): the recognizer's text is the LLM's.
        assert not [e for e in events if "input_audio_transcription" in e["type"]]
        heard = b"".join(
            base64.b64decode(e["delta"])
            for e in events
            if e["type"] == "response.output_audio.delta"
        )
        assert heard
        transcript = next(
            e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"
        )
        assert transcript

        # Barge-in: server VAD on, the user speaks over the reply; every stage stops.
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


async def test_chat_completions_with_history_speak(spec: PipelineSpec) -> None:
    async with run_server(ServerSettings(port=0), pipeline=spec) as server:
        client = AsyncOpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        completion = await client.chat.completions.create(
            model="tiny-cascade",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi there"},
                {"role": "user", "content": "how are you?"},
            ],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "pcm16"},  # type: ignore[typeddict-item]
        )
        message = completion.choices[0].message
        assert message.audio is not None
        assert base64.b64decode(message.audio.data)
        assert message.audio.transcript
        assert completion.usage is not None
        assert completion.usage.completion_tokens > 0
        # Counted by the LLM, which writes the reply (the recognizer counts nothing), and
        # cut at its most tokens as the LLM says.
        assert completion.usage.prompt_tokens > 0
        most = spec.stage("llm").engine.args["max_new_tokens"]
        cut = completion.usage.completion_tokens == most
        assert completion.choices[0].finish_reason == ("length" if cut else "stop")


async def _recognized(spec: PipelineSpec, pcm: bytes) -> str:
    """What the recognizer, run alone with the preset's arguments, hears in ``pcm``
    (PCM16 at 24 kHz) once it is resampled to the pipeline's input rate as a session
    resamples it."""
    audio = CallerAudio(spec.inputs.sample_rate)
    samples = torch.frombuffer(bytearray(pcm), dtype=torch.int16)
    heard = torch.cat((audio.take(samples, 24000), audio.flush()))

    async def inputs(fields: Sequence[Fields]) -> AsyncIterator[Fields]:
        for item in fields:
            yield item

    engine = RecognizerEngine(AsrArgs.model_validate(spec.stage("asr").engine.args))
    await engine.start()
    try:
        told = [{"audio": heard}, {"turn": "commit"}]
        outputs = [o async for o in engine.generate(SessionKey("r#1"), inputs(told))]
    finally:
        await engine.stop()
    (text,) = [o["text"] for o in outputs if "text" in o]
    assert isinstance(text, str)
    return text


async def test_the_callers_transcript_is_the_recognizers(spec: PipelineSpec) -> None:
    pcm = speech(0.8, seed=6)
    expected = await _recognized(spec, pcm)
    assert expected  # random weights: random text, but some
    async with run_server(ServerSettings(port=0), pipeline=spec) as server:
        client = AsyncOpenAI(
            api_key="unused", websocket_base_url=server.ws_url.removesuffix("/realtime")
        )
        async with client.realtime.connect(model="tiny-cascade") as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {
                        "input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}
                    },
                }
            )
            assert (await conn.recv()).type == "session.updated"
            await conn.input_audio_buffer.append(audio=b64(pcm))
            await conn.input_audio_buffer.commit()
            committed = await conn.recv()
            assert committed.type == "input_audio_buffer.committed"
            await conn.response.create()
            events = []
            async for event in conn:
                events.append(event)
                if event.type == "response.done":
                    break
        assert events[-1].response.status in ("completed", "incomplete")
        told = [
            e for e in events if e.type.startswith("conversation.item.input_audio_transcription.")
        ]
        *deltas, completed = told
        assert completed.type == "conversation.item.input_audio_transcription.completed"
        assert completed.item_id == committed.item_id
        assert completed.transcript == expected
        assert completed.usage.seconds == pytest.approx(0.8)
        # The recognizer streams its text: a delta per token that adds to it.
        assert {d.type for d in deltas} == {"conversation.item.input_audio_transcription.delta"}
        assert len(deltas) > 1
        assert "".join(d.delta for d in deltas) == expected
        assert all(d.item_id == committed.item_id for d in deltas)


async def test_a_turn_the_recognizer_cannot_transcribe_fails_its_transcript_and_reply(
    spec: PipelineSpec,
) -> None:
    async with run_server(ServerSettings(port=0), pipeline=spec) as server:
        client = AsyncOpenAI(
            api_key="unused", websocket_base_url=server.ws_url.removesuffix("/realtime")
        )
        async with client.realtime.connect(model="tiny-cascade") as conn:
            assert (await conn.recv()).type == "session.created"
            # tiny-cascade's Whisper knows English only: the turn cannot be transcribed.
            transcription = {"model": "tiny-cascade", "language": "xx"}
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {"input": {"turn_detection": None, "transcription": transcription}},
                }
            )
            assert (await conn.recv()).type == "session.updated"
            await conn.input_audio_buffer.append(audio=b64(speech(0.3, seed=7)))
            await conn.input_audio_buffer.commit()
            committed = await conn.recv()
            assert committed.type == "input_audio_buffer.committed"
            await conn.response.create()
            events = []
            async for event in conn:
                events.append(event)
                if event.type == "response.done":
                    break
        (failed,) = [e for e in events if "input_audio_transcription" in e.type]
        assert failed.type == "conversation.item.input_audio_transcription.failed"
        assert failed.item_id == committed.item_id
        assert "xx" in failed.error.message
        # The LLM has no text for the turn: the reply fails with it.
        assert events[-1].response.status == "failed"
