"""``POST /v1/chat/completions`` on the scripted pipeline: the official ``openai``
client (text and audio, streamed and not), bad input, auth, a full server, a failing
reply, and a client that goes away mid-stream."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import wave
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import openai
import pytest
import pytest_asyncio
from http_client import get, post, raw_post
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from realtime_client import connect

from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.events import AudioDelta
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing import eventually

TEXT = "".join(f"t{k} " for k in range(32))  # the scripted thinker's 32 outputs
USER_HELLO = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "hello"}],
}
HELLO = [{"role": "user", "content": "hello"}]
AUDIO = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
FAST = ServerSettings(preset="scripted-omni", port=0)


def client_of(server: RunningServer, key: str = "unused") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=20)


def scripted(**thinker: Any) -> PipelineSpec:
    """scripted-omni with its thinker's arguments overridden."""
    data: dict[str, Any] = load_pipeline("scripted-omni").model_dump(by_alias=True)
    data["stages"][0]["engine"]["args"].update(thinker)
    return PipelineSpec.model_validate(data)


async def pipeline_audio(server: RunningServer) -> np.ndarray:
    """The audio the pipeline makes for "hello", as PCM16 (the reply must carry it)."""
    events = [e async for e in server.state.pipeline.generate(text="hello")]
    samples = np.concatenate([e.audio.numpy() for e in events if isinstance(e, AudioDelta)])
    assert server.state.pipeline.spec.outputs.sample_rate == 24_000  # no resampling
    return np.rint(np.clip(samples * 32768, -32768, 32767)).astype(np.int16)


async def nothing_held(server: RunningServer) -> None:
    """No session slot taken, no session left on any stage."""

    async def released() -> None:
        assert server.state.active == 0
        live = await server.state.pipeline.live_sessions()
        assert not any(live.values()), live

    await eventually(released)


async def chat(server: RunningServer, body: Any, **headers: str) -> tuple[int, Any]:
    return await post(server.url + "/v1/chat/completions", body, headers)


# -- replies ---------------------------------------------------------------------------


async def test_a_text_reply(server: RunningServer) -> None:
    completion = await client_of(server).chat.completions.create(
        model="scripted-omni", messages=HELLO
    )
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == "scripted-omni"
    [choice] = completion.choices
    assert (choice.message.role, choice.message.content) == ("assistant", TEXT)
    assert choice.message.audio is None
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 32
    await nothing_held(server)


async def test_a_streamed_text_reply(server: RunningServer) -> None:
    stream = await client_of(server).chat.completions.create(
        model="scripted-omni",
        messages=HELLO,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert {c.id for c in chunks} == {chunks[0].id}
    assert chunks[0].choices[0].delta.role == "assistant"
    *pieces, finish, usage = chunks
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == TEXT
    assert all(c.choices[0].finish_reason is None for c in pieces)
    assert finish.choices[0].finish_reason == "stop"
    assert usage.choices == []
    assert usage.usage is not None
    assert usage.usage.completion_tokens == 32
    await nothing_held(server)


async def test_an_audio_reply_is_one_wav_file(server: RunningServer) -> None:
    completion = await client_of(server).chat.completions.create(
        model="scripted-omni",
        messages=HELLO,
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
    )
    message = completion.choices[0].message
    assert message.content is None
    assert message.audio is not None
    assert message.audio.id.startswith("audio_")
    assert message.audio.transcript == TEXT
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24_000)
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    np.testing.assert_array_equal(pcm, await pipeline_audio(server))
    await nothing_held(server)


async def test_an_audio_reply_as_pcm16(server: RunningServer) -> None:
    status, body = await chat(server, {"messages": HELLO, **AUDIO})
    assert status == 200, body
    data = base64.b64decode(body["choices"][0]["message"]["audio"]["data"])
    assert body["choices"][0]["message"]["audio"]["expires_at"] == body["created"] + 24 * 3600
    assert len(data) % 2 == 0
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), await pipeline_audio(server))


async def test_a_streamed_audio_reply_carries_pcm16_and_its_transcript(
    server: RunningServer,
) -> None:
    stream = await client_of(server).chat.completions.create(
        model="scripted-omni",
        messages=HELLO,
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks][-2:] == [None, "stop"]
    pieces = [c.choices[0].delta.audio for c in chunks[1:-1]]
    assert all(p is not None for p in pieces)
    audio = [p for p in pieces if p is not None]
    assert {p.id for p in audio} == {audio[0].id}
    assert all(c.choices[0].delta.content is None for c in chunks)
    data = [base64.b64decode(p.data) for p in audio if p.data]
    assert all(len(d) % 2 == 0 for d in data)
    pcm = np.frombuffer(b"".join(data), "<i2")
    np.testing.assert_array_equal(pcm, await pipeline_audio(server))
    assert "".join(p.transcript for p in audio if p.transcript) == TEXT
    last = audio[-1]
    assert (last.data, last.transcript) == (None, None)
    assert last.expires_at == chunks[0].created + 24 * 3600
    await nothing_held(server)


async def test_parameters_at_their_neutral_values_are_taken(server: RunningServer) -> None:
    completion = await client_of(server).chat.completions.create(
        model="scripted-omni",
        messages=HELLO,
        n=1,
        top_p=1,
        frequency_penalty=0,
        presence_penalty=0,
        logprobs=False,
        logit_bias={},
        store=False,
        service_tier="auto",
        response_format={"type": "text"},
    )
    assert completion.choices[0].message.content == TEXT


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_ends_the_text_before_it(server: RunningServer, stream: bool) -> None:
    # "2 t" spans two tokens ("t2 ", "t3 "): what precedes it is all the reply.
    kwargs: dict[str, Any] = {"model": "scripted-omni", "messages": HELLO, "stop": ["zz", "2 t"]}
    client = client_of(server)
    if stream:
        chunks = [
            c
            async for c in await client.chat.completions.create(
                **kwargs, stream=True, stream_options={"include_usage": True}
            )
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        usage = chunks[-1].usage
    else:
        completion = await client.chat.completions.create(**kwargs)
        text = completion.choices[0].message.content or ""
        reasons = [completion.choices[0].finish_reason]
        usage = completion.usage
    assert text == "t0 t1 t"
    assert reasons[-1] == "stop"
    assert usage is not None
    # The engine's count: t0..t3 (the stop string ended in the 4th), and what it made
    # before the cancel reached it.
    assert usage.completion_tokens >= 4
    await nothing_held(server)


async def test_a_stop_string_never_met_holds_nothing_back(server: RunningServer) -> None:
    # The reply ends with "t31 ", the start of the stop string: held, then handed out.
    completion = await client_of(server).chat.completions.create(
        model="scripted-omni", messages=HELLO, stop="t31 x"
    )
    assert completion.choices[0].message.content == TEXT
    assert completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("cap", "reason"), [(4, "length"), (64, "stop")])
async def test_a_reply_cut_by_the_engines_own_cap_ends_with_length(cap: int, reason: str) -> None:
    # The request sets no max_tokens: the cap is the engine's (a preset's max_new_tokens).
    async with run_server(FAST, pipeline=scripted(max_new_tokens=cap)) as server:
        completion = await client_of(server).chat.completions.create(
            model="scripted-omni", messages=HELLO
        )
        assert completion.choices[0].finish_reason == reason
        assert completion.usage is not None
        assert completion.usage.completion_tokens == min(cap, 32)
        async with connect(server.ws_url) as client:  # realtime: OpenAI's incomplete
            await client.no_vad()
            await client.send("conversation.item.create", item=USER_HELLO)
            await client.send("response.create")
            done = (await client.until("response.done"))[-1]["response"]
            if reason == "length":
                assert done["status"] == "incomplete"
                assert done["status_details"] == {
                    "type": "incomplete",
                    "reason": "max_output_tokens",
                    "error": None,
                }
                assert done["output"][0]["status"] == "incomplete"
            else:
                assert done["status"] == "completed"


async def test_system_messages_are_refused_by_an_entry_stage_without_instructions(
    server: RunningServer,
) -> None:
    # Never dropped without a word: refused by name, as unsupported formats are.
    messages = [*HELLO, {"role": "system", "content": "Be brief."}]
    status, reply = await chat(server, {"messages": messages})
    assert status == 400, reply
    assert reply["error"]["param"] == "messages[1]"
    assert reply["error"]["code"] == "unsupported_message"
    assert "takes no instructions" in reply["error"]["message"]


# -- bad input -------------------------------------------------------------------------

WAV_GARBAGE = base64.b64encode(b"RIFF not really a wave file").decode()
BAD: list[tuple[str, bytes | dict[str, Any], str | None, str]] = [
    ("not JSON", b'{"messages": [', None, "invalid_json"),
    ("a wrong type", {"messages": 3}, "messages", "invalid_value"),
    ("no messages", {"model": "scripted-omni"}, None, "invalid_value"),
    ("an unknown role", {"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role",
     "invalid_value"),
    ("an unknown part", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].type", "invalid_value"),
    ("no user message", {"messages": [{"role": "system", "content": ""}]}, "messages",
     "missing_required_parameter"),
    ("an assistant message", {"messages": [*HELLO, {"role": "assistant", "content": "x"}]},
     "messages[1]", "unsupported_message"),
    ("a tool message", {"messages": [*HELLO, {"role": "tool", "content": "x"}]},
     "messages[1]", "unsupported_message"),
    ("bad base64 audio", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}]}]},
     "messages[0].content[0].input_audio.data", "invalid_base64"),
    ("audio that is not WAV", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": WAV_GARBAGE, "format": "wav"}}]}]},
     "messages[0].content[0].input_audio.data", "invalid_audio"),
    ("odd PCM16 bytes", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "pcm16"}}]}]},
     "messages[0].content[0].input_audio.data", "odd_length"),
    ("mp3 input", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}]}]},
     "messages[0].content[0].input_audio.format", "unsupported_value"),
    ("mp3 output", {"messages": HELLO, "modalities": ["text", "audio"],
                    "audio": {"voice": "alloy", "format": "mp3"}},
     "audio.format", "unsupported_value"),
    ("streamed WAV", {"messages": HELLO, "stream": True, "modalities": ["text", "audio"],
                      "audio": {"voice": "alloy", "format": "wav"}},
     "audio.format", "unsupported_value"),
    ("audio without its settings", {"messages": HELLO, "modalities": ["text", "audio"]},
     "audio", "missing_required_parameter"),
    ("a negative temperature", {"messages": HELLO, "temperature": -1}, "temperature",
     "invalid_value"),
    ("zero tokens", {"messages": HELLO, "max_completion_tokens": 0}, "max_completion_tokens",
     "invalid_value"),
    ("two replies", {"messages": HELLO, "n": 2}, "n", "invalid_value"),
    ("logprobs", {"messages": HELLO, "logprobs": True}, "logprobs", "unsupported_parameter"),
    ("top_logprobs", {"messages": HELLO, "top_logprobs": 2}, "top_logprobs",
     "unsupported_parameter"),
    ("a seed", {"messages": HELLO, "seed": 3}, "seed", "unsupported_parameter"),
    ("top_p", {"messages": HELLO, "top_p": 0.5}, "top_p", "unsupported_parameter"),
    ("a penalty", {"messages": HELLO, "presence_penalty": 1}, "presence_penalty",
     "unsupported_parameter"),
    ("store", {"messages": HELLO, "store": True}, "store", "unsupported_parameter"),
    ("JSON mode", {"messages": HELLO, "response_format": {"type": "json_object"}},
     "response_format", "unsupported_value"),
    ("a JSON schema", {"messages": HELLO, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     "response_format", "unsupported_value"),
    ("an unknown parameter", {"messages": HELLO, "user": "u"}, "user", "unknown_parameter"),
    ("stop on a voiced reply", {"messages": HELLO, **AUDIO, "stop": "t3"}, "stop",
     "unsupported_parameter"),
    ("five stop strings", {"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, "stop",
     "invalid_value"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param", "code"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
async def test_bad_input_is_refused_with_openais_error_shape(
    server: RunningServer, body: bytes | dict[str, Any], param: str | None, code: str
) -> None:
    status, reply = await chat(server, body)
    assert status == 400, reply
    assert reply["error"]["type"] == "invalid_request_error"
    assert (reply["error"]["param"], reply["error"]["code"]) == (param, code)
    assert reply["error"]["message"]
    await nothing_held(server)


# -- auth, a full server, a failing reply ----------------------------------------------


async def test_an_api_key_is_required_when_one_is_set() -> None:
    async with run_server(ServerSettings(preset="scripted-omni", port=0, api_key="s3cret")) as s:
        status, reply = await chat(s, {"messages": HELLO})
        assert status == 401
        assert reply["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await client_of(s, key="wrong").chat.completions.create(
                model="scripted-omni", messages=HELLO
            )
        completion = await client_of(s, key="s3cret").chat.completions.create(
            model="scripted-omni", messages=HELLO
        )
        assert completion.choices[0].message.content == TEXT


async def test_a_full_or_draining_server_answers_busy() -> None:
    settings = ServerSettings(preset="scripted-omni", port=0, max_sessions=1)
    async with run_server(settings) as server:
        async with connect(server.ws_url):  # holds the only slot
            status, reply = await chat(server, {"messages": HELLO})
            assert status == 503, reply
            assert (reply["error"]["type"], reply["error"]["code"]) == ("server_error", "busy")
            assert server.state.active == 1
        await eventually(lambda: server.state.active == 0)
        status, reply = await chat(server, {"messages": HELLO})
        assert status == 200, reply
        server.state.draining = True
        status, reply = await chat(server, {"messages": HELLO})
        assert status == 503, reply
        assert "shutting down" in reply["error"]["message"]
        server.state.draining = False
        await nothing_held(server)


async def test_a_failed_reply_is_a_500_with_the_pipelines_error_code() -> None:
    async with run_server(FAST, pipeline=scripted(fail_after=3)) as server:
        status, reply = await chat(server, {"messages": HELLO})
        assert status == 500, reply
        assert (reply["error"]["type"], reply["error"]["code"]) == ("server_error", "engine_error")
        stream = await client_of(server).chat.completions.create(
            model="scripted-omni",
            messages=HELLO,
            stream=True,
        )
        received: list[Any] = []

        async def read() -> None:
            async for chunk in stream:
                received.append(chunk)

        with pytest.raises(openai.APIError, match="fail"):
            await read()
        assert "".join(c.choices[0].delta.content or "" for c in received) == "t0 t1 t2 "
        await nothing_held(server)


# -- a client that goes away -----------------------------------------------------------


@pytest_asyncio.fixture
async def slow() -> AsyncIterator[RunningServer]:
    """A thinker that takes 50 ms per output: a reply of 32 lasts 1.6 s."""
    async with run_server(FAST, pipeline=scripted(per_output_s=0.05)) as running:
        yield running


async def test_a_client_leaving_mid_stream_aborts_its_session(slow: RunningServer) -> None:
    body = {"messages": HELLO, "stream": True}
    async with raw_post(slow.url + "/v1/chat/completions", body) as reply:
        assert await reply.line() == "HTTP/1.1 200 OK"
        await reply.until('data: {"id"')  # the role chunk
        first = json.loads((await reply.until("data: "))[len("data: ") :])
        assert first["choices"][0]["delta"]["content"] == "t0 "
        live = await slow.state.pipeline.live_sessions()
        assert live["thinker"] == [first["id"]]
    # The socket is closed mid-reply.
    await nothing_held(slow)
    _, text = await get(slow.url + "/metrics")
    samples = {
        (s.name, s.labels.get("status")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("omni_chat_completions_total", "cancelled")] == 1
    assert ("omni_responses_total", "completed") not in samples  # it never completed


async def test_a_draining_server_lets_a_reply_in_flight_finish() -> None:
    async with run_server(FAST, pipeline=scripted(per_output_s=0.05)) as server:
        request = asyncio.create_task(chat(server, {"messages": HELLO}))
        await eventually(lambda: server.state.chats == 1)
        assert server.state.responding()  # what the drain waits on, grace_s at most
        await server.shutdown()
        status, reply = await request
        assert status == 200, reply
        assert reply["choices"][0]["message"]["content"] == TEXT
