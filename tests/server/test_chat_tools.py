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
from http_client import post
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


async def test_a_streamed_call_is_one_tool_calls_delta(weather: RunningServer) -> None:
    stream = await _client(weather).chat.completions.create(
        model="weather", messages=[ASK], tools=TOOLS, stream=True
    )
    content = ""
    calls: list[Any] = []
    finish = None
    async for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert content == SAID + " "
    assert finish == "tool_calls"
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments or "") == {"city": "Paris"}


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
        await _client(server).chat.completions.create(model="scripted", messages=[ASK], tools=TOOLS)
    assert refused.value.body["param"] == "tools"  # type: ignore[index]
    assert "takes no tools" in refused.value.body["message"]  # type: ignore[index]
