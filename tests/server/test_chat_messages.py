"""What a chat completion's messages become in the pipeline: instructions, one turn per
user message, audio parts, and the token limit (``chat_engines.Echo`` shows it all), and
earlier replies (``chat_engines.Transcript`` shows the conversation it holds)."""

from __future__ import annotations

import base64
import io
import re
import wave
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from chat_engines import SAMPLES_PER_CHAR
from http_client import post
from openai import AsyncOpenAI

from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings

ECHO = PipelineSpec.model_validate(
    {
        "name": "echo",
        "stages": [
            {"name": "echo", "engine": {"kind": "chat_engines:Echo"}},
            {"name": "voice", "engine": {"kind": "chat_engines:Voice"}},
        ],
        "edges": [{"from": "echo", "to": "voice"}],
        "outputs": {"text": "echo", "audio": "voice", "sample_rate": 24_000},
        "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
    }
)


@pytest_asyncio.fixture
async def echo() -> AsyncIterator[RunningServer]:
    async with run_server(ServerSettings(port=0), pipeline=ECHO) as running:
        yield running


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def audio(data: bytes, fmt: str) -> dict[str, Any]:
    payload = base64.b64encode(data).decode()
    return {"type": "input_audio", "input_audio": {"data": payload, "format": fmt}}


def wav_file(samples: int, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.full(samples, 1000, "<i2").tobytes())
    return out.getvalue()


async def reply(server: RunningServer, **body: Any) -> tuple[str | None, dict[str, Any]]:
    status, answer = await post(server.url + "/v1/chat/completions", body)
    assert status == 200, answer
    choice: dict[str, Any] = answer["choices"][0]
    return choice["message"]["content"], choice


async def test_system_and_developer_messages_are_the_instructions(echo: RunningServer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [text("Be kind.")]},
        {"role": "user", "content": "hello"},
    ]
    content, _ = await reply(echo, messages=messages)
    assert content == "[Be brief.\nBe kind.]hello"


async def test_each_user_message_is_a_turn_of_its_parts(echo: RunningServer) -> None:
    messages = [
        user(text("one")),
        {"role": "user", "content": "two"},
        user(text("th"), text("ree")),
    ]
    content, _ = await reply(echo, messages=messages)
    assert content == "one|two|three"


async def test_audio_parts_reach_the_entry_stage(echo: RunningServer) -> None:
    input_rate = ECHO.inputs.sample_rate  # a WAV at this rate is sent as is
    messages = [
        user(text("say "), audio(wav_file(1600, input_rate), "wav")),
        user(audio(np.full(2400, 1000, "<i2").tobytes(), "pcm16")),  # 100 ms at 24 kHz
    ]
    content, _ = await reply(echo, messages=messages)
    assert content is not None
    first, second = content.split("|")
    assert first == "say <audio:1600>"
    # Resampled to the input rate as one stream: its tail comes with the commit.
    pieces = re.fullmatch(r"(<audio:\d+>)+", second)
    assert pieces is not None, second
    heard = sum(int(n) for n in re.findall(r"\d+", second))
    assert abs(heard - input_rate // 10) <= 2


async def test_a_reply_cut_by_the_token_limit_ends_with_length(echo: RunningServer) -> None:
    messages = [{"role": "user", "content": "abcdef"}]
    content, choice = await reply(echo, messages=messages, max_completion_tokens=3)
    assert (content, choice["finish_reason"]) == ("abc", "length")
    content, choice = await reply(echo, messages=messages, max_tokens=10)  # the old name
    assert (content, choice["finish_reason"]) == ("abcdef", "stop")


async def test_an_audio_reply_voices_the_whole_reply_in_the_voice_asked_for(
    echo: RunningServer,
) -> None:
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "pcm16"},
    }
    content, choice = await reply(echo, **body)
    assert content is None
    voiced = choice["message"]["audio"]
    assert voiced["transcript"] == "hello(alloy)"  # the voice reached the pipeline
    assert len(base64.b64decode(voiced["data"])) == 2 * len("hello(alloy)") * SAMPLES_PER_CHAR


# -- earlier replies -------------------------------------------------------------------


def openai_client(server: RunningServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=20)


async def test_a_multi_turn_history_with_assistant_messages_is_the_conversation(
    transcript: RunningServer,
) -> None:
    client = openai_client(transcript)
    completion = await client.chat.completions.create(
        model="transcript",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "assistant", "content": "Hello! Ask me anything."},  # before any user
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi, how can I help?"},
            {"role": "user", "content": "a joke"},
            {"role": "assistant", "content": [{"type": "text", "text": "no"}]},
            {"role": "user", "content": "please"},
        ],
    )
    said = completion.choices[0].message.content
    expected = "a:Hello! Ask me anything. u:hello a:hi, how can I help? u:a joke a:no u:please"
    assert said == f"s:Be brief. {expected}"


async def test_a_voiced_reply_appended_as_it_came_is_taken_by_its_transcript(
    transcript: RunningServer,
) -> None:
    client = openai_client(transcript)
    messages: list[Any] = [{"role": "user", "content": "hello"}]
    first = await client.chat.completions.create(
        model="transcript", messages=messages, modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
    )  # fmt: skip
    message = first.choices[0].message
    assert message.content is None
    assert message.audio is not None
    heard = message.audio.transcript
    assert heard == "u:hello"
    # What clients do: the reply message as it came (audio id, data and transcript).
    messages += [message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    second = await client.chat.completions.create(model="transcript", messages=messages)
    assert second.choices[0].message.content == f"u:hello a:{heard} u:more"


REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("an audio id alone", {"role": "assistant", "audio": {"id": "audio_abc"}},
     "messages[1].audio", "unsupported_value"),
    ("no content", {"role": "assistant"}, "messages[1].content", "missing_required_parameter"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("message", "param", "code"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
async def test_an_assistant_message_without_its_words_is_refused_by_name(
    transcript: RunningServer, message: dict[str, Any], param: str, code: str
) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}, message]}
    status, answer = await post(transcript.url + "/v1/chat/completions", body)
    assert status == 400, answer
    assert (answer["error"]["param"], answer["error"]["code"]) == (param, code)
    assert "content" in answer["error"]["message"]


async def test_an_entry_stage_keeping_no_conversation_refuses_assistant_messages(
    echo: RunningServer,
) -> None:
    body = {
        "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "x"}]
    }
    status, answer = await post(echo.url + "/v1/chat/completions", body)
    assert status == 400, answer
    assert (answer["error"]["param"], answer["error"]["code"]) == (
        "messages[1]",
        "unsupported_message",
    )
    assert "earlier reply" in answer["error"]["message"]
