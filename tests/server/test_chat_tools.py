"""Chat completion tools with the official ``openai`` client: the model's call comes back
as ``tool_calls`` with ``finish_reason: "tool_calls"`` (streamed or not, never spoken or
in the content), the call and a ``tool`` message give the final answer, and a malformed
call or a tool the pipeline cannot offer is an error."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from chat_engines import SAMPLES_PER_CHAR
from http_client import post, stream_events
from openai import AsyncOpenAI, BadRequestError
from tool_engines import SAID, TOOL, WEATHER

from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {k: v for k, v in TOOL.items() if k != "type"},
    }
]
ASK = {"role": "user", "content": "weather in Paris?"}


@pytest_asyncio.fixture
async def weather() -> AsyncIterator[RunningServer]:
    async with run_server(ServerSettings(port=0), pipeline=WEATHER) as running:
        yield running


def _client(server: RunningServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=20)


async def test_a_tool_call_round_trip(weather: RunningServer) -> None:
    client = _client(weather)
    first = await client.chat.completions.create(model="weather", messages=[ASK], tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == SAID + " "  # what it said; never the call's text
    calls = choice.message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    messages: list[Any] = [
        ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = await client.chat.completions.create(model="weather", messages=messages, tools=TOOLS)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "It is sunny. (1 call given back)"
    assert second.choices[0].message.tool_calls is None


async def test_a_streamed_call_streams_its_arguments(weather: RunningServer) -> None:
    stream = await _client(weather).chat.completions.create(
        model="weather", messages=[ASK], tools=TOOLS, stream=True
    )
    content = ""
    pieces: list[Any] = []
    finish = None
    async for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        pieces += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert content == SAID + " "
    assert finish == "tool_calls"
    # As OpenAI streams a call: the first piece names it, the others add arguments.
    first, *rest = pieces
    assert (first.index, first.type, first.function.name, first.function.arguments) == (
        0,
        "function",
        "get_weather",
        "",
    )
    assert first.id.startswith("call_")
    assert len(rest) > 5
    assert {(p.index, p.id, p.type, p.function.name) for p in rest} == {(0, None, None, None)}
    arguments = "".join(p.function.arguments for p in rest)
    assert json.loads(arguments) == {"city": "Paris"}


async def test_a_streamed_malformed_call_ends_the_stream_with_an_error(
    weather: RunningServer,
) -> None:
    body = {
        "model": "weather",
        "messages": [{"role": "user", "content": "malformed"}],
        "tools": TOOLS,
        "stream": True,
    }
    events = await stream_events(weather.url + "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "invalid_tool_call"
    pieces = [
        call
        for event in events[:-2]
        for choice in json.loads(event)["choices"]
        for call in choice["delta"].get("tool_calls", [])
    ]
    # Its start and some of its arguments went out before the JSON broke.
    assert pieces[0]["function"]["name"] == "get_weather"
    assert len(pieces) > 1
    assert not [e for e in events[:-2] if json.loads(e)["choices"][0]["finish_reason"]]


async def test_a_voiced_reply_speaks_nothing_of_its_call(weather: RunningServer) -> None:
    completion = await _client(weather).chat.completions.create(
        model="weather",
        messages=[ASK],
        tools=TOOLS,
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
    )
    message = completion.choices[0].message
    assert message.audio is not None
    assert message.audio.transcript == SAID + " "
    samples = len(base64.b64decode(message.audio.data)) // 2
    assert samples == len(SAID + " ") * SAMPLES_PER_CHAR
    assert message.tool_calls is not None


@pytest.mark.parametrize(
    ("said", "problem"), [("malformed", "not valid JSON"), ("unknown", "'launch_rockets'")]
)
async def test_a_malformed_call_is_an_error(
    weather: RunningServer, said: str, problem: str
) -> None:
    body = {"model": "weather", "messages": [{"role": "user", "content": said}], "tools": TOOLS}
    status, answer = await post(weather.url + "/v1/chat/completions", body)
    assert status == 500
    assert answer["error"]["code"] == "invalid_tool_call"
    assert problem in answer["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": [*TOOLS, *TOOLS]}, "tools[1].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            "tool_choice",
        ),
        (
            {
                "messages": [
                    ASK,
                    {"role": "tool", "tool_call_id": "call_nope", "content": "sunny"},
                ]
            },
            "messages[1].tool_call_id",
        ),
        (
            {
                "messages": [
                    ASK,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": "{oops"},
                            }
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
async def test_tools_it_cannot_take_are_refused_by_name(
    weather: RunningServer, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequestError) as refused:
        await _client(weather).chat.completions.create(
            **{"model": "weather", "messages": [ASK], "tools": TOOLS, **extra}
        )
    assert refused.value.body["param"] == param  # type: ignore[index]


async def test_tools_on_a_pipeline_that_takes_none_are_refused(server: RunningServer) -> None:
    with pytest.raises(BadRequestError) as refused:
        await _client(server).chat.completions.create(
            model="scripted-omni", messages=[ASK], tools=TOOLS
        )
    assert refused.value.body["param"] == "tools"  # type: ignore[index]
    assert "takes no tools" in refused.value.body["message"]  # type: ignore[index]
