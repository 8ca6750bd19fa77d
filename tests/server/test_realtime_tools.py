"""Realtime tools with the official ``openai`` client: a session's tools reach the entry
engine, the model's call comes back as a ``function_call`` item with its arguments
events (never spoken, never in the transcript), a ``function_call_output`` item and
``response.create`` get the answer, and a malformed call fails the response closed."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from chat_engines import SAMPLES_PER_CHAR
from openai import AsyncOpenAI
from tool_engines import CALL, SAID, TOOL, WEATHER

from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings


@pytest_asyncio.fixture
async def weather() -> AsyncIterator[RunningServer]:
    async with run_server(ServerSettings(port=0), pipeline=WEATHER) as running:
        yield running


def _client(server: RunningServer) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="unused", websocket_base_url=server.ws_url.removesuffix("/realtime"))


async def _until_done(conn: Any) -> tuple[list[Any], bytes, str]:
    """The events of one response up to ``response.done``, its audio and transcript
    (the ``rate_limits.updated`` that follows ``response.done`` is read too)."""
    events: list[Any] = []
    audio = bytearray()
    transcript = ""
    async for event in conn:
        events.append(event)
        if event.type == "response.output_audio.delta":
            audio += base64.b64decode(event.delta)
        elif event.type == "response.output_audio_transcript.delta":
            transcript += event.delta
        elif event.type == "response.done":
            break
    assert (await conn.recv()).type == "rate_limits.updated"
    return events, bytes(audio), transcript


async def _ask(conn: Any, text: str) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await conn.conversation.item.create(item=item)
    await conn.response.create()


async def _session(conn: Any, **session: Any) -> None:
    assert (await conn.recv()).type == "session.created"
    audio = {"input": {"turn_detection": None}}
    await conn.session.update(session={"type": "realtime", "audio": audio, **session})
    updated = await conn.recv()
    assert updated.type == "session.updated", updated


async def test_a_tool_call_round_trip(weather: RunningServer) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        await _session(conn, tools=[TOOL], tool_choice="auto")
        await _ask(conn, "weather in Paris?")
        events, audio, transcript = await _until_done(conn)
        done = events[-1]
        assert done.response.status == "completed", done.response.status_details
        calls = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(calls) == 1
        call = calls[0]
        assert call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"}
        # The call streams as the model writes it (one character per output): its item
        # once the name is written, then its arguments piece by piece, then done.
        told = [e for e in events if "audio" not in e.type]  # the speech may come between
        types = [e.type for e in told]
        at = types.index("response.output_item.added", types.index("response.content_part.added"))
        deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
        assert len(deltas) > 5
        assert "".join(d.delta for d in deltas) == call.arguments
        assert {(d.call_id, d.item_id, d.output_index) for d in deltas} == {
            (call.call_id, call.item_id, 1)
        }
        after = at + 2 + len(deltas)
        assert types[at:after] == [
            "response.output_item.added",
            "conversation.item.added",
            *["response.function_call_arguments.delta"] * len(deltas),
        ]
        assert types[after : after + 3] == [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "conversation.item.done",
        ]
        assert (told[at].item.name, told[at].item.status) == ("get_weather", "in_progress")
        item = told[after + 1].item
        assert (item.type, item.call_id, item.status) == (
            "function_call",
            call.call_id,
            "completed",
        )
        assert [o.type for o in done.response.output] == ["message", "function_call"]
        # What the reply says is spoken and transcribed; the call is neither.
        assert transcript.strip() == SAID
        assert len(audio) // 2 == len(SAID + " ") * SAMPLES_PER_CHAR

        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        await conn.conversation.item.create(item=output)
        added = await conn.recv()
        assert added.type == "conversation.item.added"
        assert added.item.type == "function_call_output"
        assert (await conn.recv()).type == "conversation.item.done"
        await conn.response.create()
        events, audio, transcript = await _until_done(conn)
        assert events[-1].response.status == "completed"
        assert transcript == "It is sunny."
        assert len(audio) // 2 == len(transcript) * SAMPLES_PER_CHAR


async def test_an_output_for_an_unknown_call_is_refused(weather: RunningServer) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        await _session(conn, tools=[TOOL])
        output = {"type": "function_call_output", "call_id": "call_nope", "output": "sunny"}
        await conn.conversation.item.create(item=output)
        error = await conn.recv()
        assert error.type == "error"
        assert error.error.param == "item.call_id"
        assert "call_nope" in error.error.message


@pytest.mark.parametrize(
    ("said", "problem"), [("malformed", "not valid JSON"), ("unknown", "'launch_rockets'")]
)
async def test_a_malformed_call_fails_the_response_unspoken(
    weather: RunningServer, said: str, problem: str
) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        await _session(conn, tools=[TOOL])
        await _ask(conn, said)
        events, audio, transcript = await _until_done(conn)
        done = events[-1].response
        assert done.status == "failed"
        assert done.status_details.error.code == "invalid_tool_call"
        assert problem in done.status_details.error.message
        assert (audio, transcript) == (b"", "")
        told = [e.type for e in events if "function_call" in e.type]
        assert "response.function_call_arguments.done" not in told
        if said == "unknown":
            # A function not offered is refused as soon as its name is written.
            assert told == []
            assert [o.type for o in done.output] == ["message"]
        else:
            # Broken JSON shows only at the end: the call had started and streamed.
            assert told
            assert set(told) == {"response.function_call_arguments.delta"}
            started = [
                e for e in events if e.type == "response.output_item.added" and e.output_index
            ]
            assert [(e.item.name, e.item.status) for e in started] == [
                ("get_weather", "in_progress")
            ]
            ended = [e for e in events if e.type == "response.output_item.done" and e.output_index]
            assert [(e.item.id, e.item.status) for e in ended] == [
                (started[0].item.id, "incomplete")
            ]
            assert [(o.type, o.status) for o in done.output] == [
                ("message", "incomplete"),
                ("function_call", "incomplete"),
            ]
        # The session goes on.
        await _ask(conn, "weather in Paris?")
        events, _, _ = await _until_done(conn)
        assert events[-1].response.status == "completed"


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "session.tools[0].type"),
        ({"tools": [{"type": "function"}]}, "session.tools[0].name"),
        ({"tools": [TOOL, TOOL]}, "session.tools[1].name"),
        ({"tool_choice": "required"}, "session.tool_choice"),
        ({"tool_choice": {"type": "function", "name": "get_weather"}}, "session.tool_choice"),
    ],
)
async def test_tools_it_cannot_offer_are_refused_by_name(
    weather: RunningServer, session: dict[str, Any], param: str
) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session={"type": "realtime", **session})
        error = await conn.recv()
        assert error.type == "error"
        assert error.error.param == param


async def test_tools_on_a_pipeline_that_takes_none_are_refused(server: RunningServer) -> None:
    async with _client(server).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session={"type": "realtime", "tools": [TOOL]})
        error = await conn.recv()
        assert error.type == "error"
        assert error.error.param == "session.tools"
        assert "takes no tools" in error.error.message


async def test_the_session_shows_its_tools(weather: RunningServer) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        await _session(conn, tools=[TOOL], tool_choice="none")
        await conn.session.update(session={"type": "realtime", "instructions": "hi"})
        updated = await conn.recv()
        assert [t.name for t in updated.session.tools] == ["get_weather"]
        assert updated.session.tool_choice == "none"
        # With tool_choice "none", no tools are offered: the model answers without.
        await _ask(conn, "weather in Paris?")
        _, _, transcript = await _until_done(conn)
        assert transcript == "No tools."


SCRIPTED_CALL = PipelineSpec.model_validate(
    {
        "name": "scripted-call",
        "stages": [
            {
                "name": "thinker",
                "engine": {
                    "kind": "scripted",
                    "args": {
                        "reply_text": f"{SAID} {CALL}",
                        "inputs": ["text", "audio", "tools", "tool_result"],
                        "per_output_s": 0.001,
                    },
                },
            },
            {
                "name": "talker",
                "engine": {
                    "kind": "scripted",
                    "args": {"outputs_per_input": 1, "fields": ["audio"], "audio_samples": 240},
                },
            },
        ],
        "edges": [{"from": "thinker", "to": "talker", "fields": ["token_ids"]}],
        "outputs": {"text": "thinker", "audio": "talker", "sample_rate": 24_000},
    }
)
"""A scripted thinker that says "Checking." and calls get_weather; one frame per token."""


async def test_a_scripted_reply_calls_the_tool_unspoken() -> None:
    async with (
        run_server(ServerSettings(port=0), pipeline=SCRIPTED_CALL) as server,
        _client(server).realtime.connect(model="scripted-call") as conn,
    ):
        await _session(conn, tools=[TOOL])
        await _ask(conn, "weather in Paris?")
        events, audio, transcript = await _until_done(conn)
        assert events[-1].response.status == "completed"
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [(d.name, json.loads(d.arguments)) for d in done] == [
            ("get_weather", {"city": "Paris"})
        ]
        assert transcript == SAID + " "
        assert len(audio) // 2 == 240  # one token said: "Checking."
        output = {"type": "function_call_output", "call_id": done[0].call_id, "output": "sunny"}
        await conn.conversation.item.create(item=output)
        await conn.response.create()
        events, _, _ = await _until_done(conn)
        assert events[-1].response.status == "completed"


async def test_a_call_given_back_reaches_the_model_and_can_be_answered(
    weather: RunningServer,
) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        await _session(conn, tools=[TOOL])
        call = {
            "type": "function_call",
            "call_id": "call_earlier",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        }
        await conn.conversation.item.create(item=call)
        added = await conn.recv()
        assert added.type == "conversation.item.added"
        assert (added.item.type, added.item.call_id) == ("function_call", "call_earlier")
        assert (await conn.recv()).type == "conversation.item.done"
        output = {"type": "function_call_output", "call_id": "call_earlier", "output": "rainy"}
        await conn.conversation.item.create(item=output)
        assert (await conn.recv()).type == "conversation.item.added"
        assert (await conn.recv()).type == "conversation.item.done"
        await conn.response.create()
        _, _, transcript = await _until_done(conn)
        assert transcript == "It is rainy. (1 call given back)"

        bad = {**call, "arguments": "{oops"}
        await conn.conversation.item.create(item=bad)
        error = await conn.recv()
        assert error.type == "error"
        assert error.error.param == "item.arguments"


async def test_function_call_items_are_held_as_items(weather: RunningServer) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        await _session(conn, tools=[TOOL])
        await _ask(conn, "weather in Paris?")
        events, _, _ = await _until_done(conn)
        message, made = events[-1].response.output
        await conn.send({"type": "conversation.item.retrieve", "item_id": made.id})
        retrieved = await conn.recv()
        assert retrieved.type == "conversation.item.retrieved", retrieved
        assert (retrieved.item.type, retrieved.item.call_id) == ("function_call", made.call_id)
        assert json.loads(retrieved.item.arguments) == {"city": "Paris"}
        # The call is part of its reply's assistant turn: it goes with the message only.
        await conn.send({"type": "conversation.item.delete", "item_id": made.id})
        refused = await conn.recv()
        assert refused.type == "error"
        assert refused.error.code == "item_delete_unsupported"
        assert message.id in refused.error.message

        output = {"type": "function_call_output", "call_id": made.call_id, "output": "sunny"}
        await conn.conversation.item.create(item=output)
        added = await conn.recv()
        assert (await conn.recv()).type == "conversation.item.done"
        await conn.send({"type": "conversation.item.retrieve", "item_id": added.item.id})
        retrieved = await conn.recv()
        assert retrieved.type == "conversation.item.retrieved", retrieved
        assert (retrieved.item.type, retrieved.item.output) == ("function_call_output", "sunny")


async def test_a_response_s_own_tools_hold_for_it_alone(weather: RunningServer) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        await _session(conn)  # the session offers no tools
        await _ask(conn, "weather in Paris?")
        _, _, transcript = await _until_done(conn)
        assert transcript == "No tools."
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "and now?"}],
        }
        await conn.conversation.item.create(item=item)
        await conn.response.create(response={"tools": [TOOL], "tool_choice": "auto"})
        events, _, _ = await _until_done(conn)
        assert events[-1].response.status == "completed", events[-1].response.status_details
        (call,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
        # The next response is back to the session's tools: none.
        await conn.response.create()
        _, _, transcript = await _until_done(conn)
        assert transcript == "No tools."


@pytest.mark.parametrize(
    ("response", "param"),
    [
        ({"tool_choice": "none"}, "response.tool_choice"),
        ({"tools": []}, "response.tools"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "response.tools[0].type"),
        ({"tool_choice": "required"}, "response.tool_choice"),
    ],
)
async def test_response_tools_it_cannot_offer_are_refused_by_name(
    weather: RunningServer, response: dict[str, Any], param: str
) -> None:
    async with _client(weather).realtime.connect(model="weather") as conn:
        await _session(conn, tools=[TOOL])
        await conn.response.create(response=response)  # type: ignore[arg-type]
        error = await conn.recv()
        assert error.type == "error", error
        assert error.error.param == param


async def test_response_tools_on_a_pipeline_that_takes_none_are_refused(
    server: RunningServer,
) -> None:
    async with _client(server).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.response.create(response={"tools": [TOOL]})
        error = await conn.recv()
        assert error.type == "error"
        assert error.error.param == "response.tools"
