"""The rest of the conversation API over ``/v1/realtime``: retrieving and deleting items,
out-of-band responses, ``rate_limits.updated``, and the input buffer left alone by
``response.create``. ``item_engines.Recall`` answers ``?`` with the conversation it
holds, so a test reads what the stages keep."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from realtime_client import RealtimeClient, connect, speech

from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings

RECALL = PipelineSpec.model_validate(
    {
        "name": "recall",
        "stages": [
            {"name": "recall", "engine": {"kind": "item_engines:Recall"}},
            {"name": "voice", "engine": {"kind": "chat_engines:Voice"}},
        ],
        "edges": [{"from": "recall", "to": "voice"}],
        "outputs": {"text": "recall", "audio": "voice", "sample_rate": 24_000},
        "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
    }
)

_events = TypeAdapter(RealtimeServerEvent)


@pytest_asyncio.fixture
async def recall() -> AsyncIterator[RunningServer]:
    async with run_server(ServerSettings(port=0), pipeline=RECALL) as running:
        yield running


async def _say(client: RealtimeClient, text: str, item_id: str) -> None:
    """A user text item, read back as added and done."""
    await client.send(
        "conversation.item.create",
        item={"type": "message", "id": item_id, "role": "user",
              "content": [{"type": "input_text", "text": text}]},
    )  # fmt: skip
    assert (await client.expect("conversation.item.added"))["item"]["id"] == item_id
    await client.expect("conversation.item.done")


async def _respond(client: RealtimeClient, **response: Any) -> tuple[dict[str, Any], str]:
    """``response.create``; its ``response.done`` response and the transcript, once its
    ``rate_limits.updated`` is read too."""
    await client.send("response.create", **({"response": response} if response else {}))
    events = await client.until("response.done")
    await client.expect("rate_limits.updated")
    done: dict[str, Any] = events[-1]["response"]
    assert done["status"] == "completed", done
    transcript = "".join(
        e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"
    )
    return done, transcript


async def test_a_deleted_item_is_out_of_every_later_response(recall: RunningServer) -> None:
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await _say(client, "one", "item_one")
        first, said = await _respond(client)
        assert said == "ONE"
        await _say(client, "two", "item_two")
        _, said = await _respond(client)
        assert said == "TWO"

        # Both middle items go: the user's and the reply to it.
        await client.send("conversation.item.delete", event_id="d1", item_id="item_one")
        assert (await client.expect("conversation.item.deleted"))["item_id"] == "item_one"
        reply_id = first["output"][0]["id"]
        await client.send("conversation.item.delete", item_id=reply_id)
        assert (await client.expect("conversation.item.deleted"))["item_id"] == reply_id

        await _say(client, "?", "item_question")
        _, said = await _respond(client)
        assert said == "u:two a:TWO"

        # Deleted items are gone from what the server holds.
        await client.send("conversation.item.retrieve", event_id="r1", item_id="item_one")
        error = await client.error()
        assert error["code"] == "item_retrieve_invalid_item_id"
        assert error["param"] == "item_id"
        assert error["event_id"] == "r1"


async def test_an_item_deleted_before_any_response_is_never_answered(
    recall: RunningServer,
) -> None:
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await _say(client, "early", "item_early")
        await client.send("conversation.item.delete", item_id="item_early")
        await client.expect("conversation.item.deleted")
        await _say(client, "late", "item_late")
        _, said = await _respond(client)
        assert said == "LATE"


async def test_retrieve_answers_the_items_as_the_server_holds_them(
    recall: RunningServer,
) -> None:
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await _say(client, "hi", "item_hi")
        done, _ = await _respond(client)
        await client.say(speech(0.1))
        await client.send("input_audio_buffer.commit")
        audio_item = (await client.expect("input_audio_buffer.committed"))["item_id"]
        await client.until("conversation.item.done")

        await client.send("conversation.item.retrieve", item_id="item_hi")
        item = (await client.expect("conversation.item.retrieved"))["item"]
        assert item["role"] == "user"
        assert item["content"] == [
            {"type": "input_text", "text": "hi", "audio": None, "transcript": None}
        ]
        await client.send("conversation.item.retrieve", item_id=done["output"][0]["id"])
        reply = await client.expect("conversation.item.retrieved")
        assert reply["item"]["role"] == "assistant"
        assert reply["item"]["status"] == "completed"
        assert reply["item"]["content"][0]["type"] == "output_audio"
        assert reply["item"]["content"][0]["transcript"] == "HI"
        await client.send("conversation.item.retrieve", item_id=audio_item)
        heard = await client.expect("conversation.item.retrieved")
        assert heard["item"]["content"][0]["type"] == "input_audio"
        assert heard["item"]["content"][0]["transcript"] is None
        for event in client.seen:
            _events.validate_python(event)


async def test_delete_errors_lose_nothing(recall: RunningServer) -> None:
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await _say(client, "keep", "item_keep")
        # A second item under its id.
        await client.send(
            "conversation.item.create",
            event_id="twice",
            item={"type": "message", "id": "item_keep", "role": "user",
                  "content": [{"type": "input_text", "text": "again"}]},
        )  # fmt: skip
        error = await client.error()
        assert (error["param"], error["event_id"]) == ("item.id", "twice")
        # Malformed: the item_id is missing, or not a string.
        await client.send("conversation.item.delete", event_id="bad")
        error = await client.error()
        assert (error["code"], error["param"], error["event_id"]) == (
            "invalid_event",
            "$.item_id",
            "bad",
        )
        await client.send("conversation.item.delete", item_id=7)
        assert (await client.error())["param"] == "$.item_id"
        # Unknown.
        await client.send("conversation.item.delete", event_id="who", item_id="item_nobody")
        error = await client.error()
        assert error["code"] == "item_delete_invalid_item_id"
        assert error["param"] == "item_id"
        assert error["event_id"] == "who"
        # While a response is in flight: the client cancels it or waits for its
        # response.done.
        await client.send("response.create")
        await client.until("response.created")
        await client.send("conversation.item.delete", event_id="busy", item_id="item_keep")
        events = await client.until("error")
        error = events[-1]["error"]
        assert error["code"] == "conversation_already_has_active_response"
        assert error["event_id"] == "busy"
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "completed"
        await client.expect("rate_limits.updated")
        # Nothing was lost: the item is held, and the stages still have it.
        await client.send("conversation.item.retrieve", item_id="item_keep")
        assert (await client.expect("conversation.item.retrieved"))["item"]["id"] == "item_keep"
        await _say(client, "?", "item_question")
        _, said = await _respond(client)
        assert said == "u:keep a:KEEP"


async def test_an_out_of_band_response_leaves_the_conversation_as_it_was(
    recall: RunningServer,
) -> None:
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await _say(client, "hello", "item_hello")
        await _respond(client)
        await client.send(
            "response.create",
            response={"conversation": "none", "metadata": {"topic": "summary"}},
        )
        events = await client.until("response.done")
        done = events[-1]["response"]
        assert done["status"] == "completed"
        assert done["conversation_id"] is None
        assert done["metadata"] == {"topic": "summary"}
        assert all(e["type"] != "conversation.item.added" for e in events)
        await client.expect("rate_limits.updated")
        # Its item is not in the conversation, and the stages forgot its reply.
        await client.send("conversation.item.retrieve", item_id=done["output"][0]["id"])
        assert (await client.error())["code"] == "item_retrieve_invalid_item_id"
        await _say(client, "?", "item_question")
        _, said = await _respond(client)
        assert said == "u:hello a:HELLO"


async def test_out_of_band_options_it_cannot_honour_are_refused_by_name(
    recall: RunningServer,
) -> None:
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await client.send("response.create", event_id="x", response={"conversation": "other"})
        error = await client.error()
        assert (error["param"], error["event_id"]) == ("response.conversation", "x")
        await client.send(
            "response.create", response={"conversation": "none", "input": []}, event_id="y"
        )
        error = await client.error()
        assert (error["param"], error["event_id"]) == ("response.input", "y")
        _, said = await _respond(client)  # the session goes on
        assert said == "-"


async def test_response_create_leaves_the_input_buffer_alone(recall: RunningServer) -> None:
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await client.say(speech(0.2))
        events: list[dict[str, Any]] = []
        await client.send("response.create")
        events = await client.until("response.done")
        assert all(e["type"] != "input_audio_buffer.committed" for e in events)
        assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == "-"
        await client.expect("rate_limits.updated")
        # The audio is still there, uncommitted: a commit makes it the next turn.
        await client.send("input_audio_buffer.commit")
        await client.expect("input_audio_buffer.committed")
        await client.until("conversation.item.done")
        _, said = await _respond(client)
        assert said.startswith("<AUDIO>")
        assert said.replace("<AUDIO>", "") == ""


async def test_rate_limits_follow_each_response_done(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.ask(0.1)
        await client.until("response.done")
        event = await client.expect("rate_limits.updated")
        assert event["rate_limits"] == [
            {"name": "requests", "limit": 64, "remaining": 63, "reset_seconds": 0.0}
        ]
        _events.validate_python(event)


async def test_the_openai_client_retrieves_deletes_and_asks_out_of_band(
    recall: RunningServer,
) -> None:
    client = AsyncOpenAI(
        api_key="unused", websocket_base_url=recall.ws_url.removesuffix("/realtime")
    )
    async with client.realtime.connect(model="recall") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        assert (await conn.recv()).type == "session.updated"

        async def said_to(text: str, **response: Any) -> tuple[str, str]:
            """Add a user item, respond; the reply's transcript and its item's id."""
            if text:
                await conn.conversation.item.create(
                    item={"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": text}]}
                )  # fmt: skip
            await conn.response.create(**({"response": response} if response else {}))
            transcript, item_id = "", ""
            async for event in conn:
                if event.type == "response.output_audio_transcript.delta":
                    transcript += event.delta
                elif event.type == "response.done":
                    assert event.response.output
                    item_id = event.response.output[0].id or ""
                elif event.type == "rate_limits.updated":
                    assert event.rate_limits
                    return transcript, item_id
            raise AssertionError("the connection ended")

        said, reply_item = await said_to("first")
        assert said == "FIRST"
        said, _ = await said_to("", conversation="none", metadata={"why": "aside"})
        assert said == "-"
        await conn.conversation.item.retrieve(item_id=reply_item)
        retrieved = await conn.recv()
        assert retrieved.type == "conversation.item.retrieved"
        assert retrieved.item.id == reply_item
        await conn.conversation.item.delete(item_id=reply_item)
        deleted = await conn.recv()
        assert deleted.type == "conversation.item.deleted"
        assert deleted.item_id == reply_item
        said, _ = await said_to("?")
        assert said == "u:first"


async def test_a_deleted_assistant_item_is_out_of_every_later_response(
    recall: RunningServer,
) -> None:
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await _say(client, "one", "item_one")
        await client.send(
            "conversation.item.create",
            item={"type": "message", "id": "item_said", "role": "assistant",
                  "content": [{"type": "output_text", "text": "given"}]},
        )  # fmt: skip
        assert (await client.expect("conversation.item.added"))["item"]["id"] == "item_said"
        await client.expect("conversation.item.done")
        await _say(client, "?", "item_question")
        _, said = await _respond(client)
        assert said == "u:one a:given"

        await client.send("conversation.item.delete", item_id="item_said")
        assert (await client.expect("conversation.item.deleted"))["item_id"] == "item_said"
        await _say(client, "?", "item_again")
        _, said = await _respond(client)
        # The first question and its answer stay; the given turn is gone from before them.
        assert said == "u:one u:? a:u:one a:given"
