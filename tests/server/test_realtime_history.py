"""The conversation a realtime session holds, through the official ``openai`` client:
assistant items are earlier replies, and a response's own instructions hold for it
alone (``chat_engines.Transcript`` replies with the conversation as it holds it)."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from realtime_client import connect

from omni_actors.server.runner import RunningServer


def connection(server: RunningServer) -> Any:
    client = AsyncOpenAI(
        api_key="unused", websocket_base_url=server.ws_url.removesuffix("/realtime")
    )
    return client.realtime.connect(model="transcript")


async def opened(conn: AsyncRealtimeConnection, instructions: str) -> None:
    assert (await conn.recv()).type == "session.created"
    await conn.session.update(
        session={
            "type": "realtime",
            "instructions": instructions,
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}},
        }
    )
    assert (await conn.recv()).type == "session.updated"


async def add(conn: AsyncRealtimeConnection, role: str, *content: dict[str, Any]) -> Any:
    """Add an item; its ``conversation.item.done`` (or the ``error`` refusing it)."""
    await conn.conversation.item.create(item={"type": "message", "role": role, "content": content})  # type: ignore[typeddict-item]
    async for event in conn:
        if event.type in ("conversation.item.done", "error"):
            return event
    raise AssertionError("the connection closed")


async def answer(conn: AsyncRealtimeConnection, **response: Any) -> str:
    """A response's text, once it is done."""
    await conn.response.create(response=response or None)  # type: ignore[arg-type]
    text = ""
    async for event in conn:
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.done":
            assert event.response.status == "completed", event.response
            return text
    raise AssertionError("the connection closed")


def said(text: str) -> dict[str, Any]:
    return {"type": "input_text", "text": text}


async def test_assistant_items_are_earlier_replies(transcript: RunningServer) -> None:
    async with connection(transcript) as conn:
        await opened(conn, "Be brief.")
        await add(conn, "user", said("hello"))
        done = await add(conn, "assistant", {"type": "output_text", "text": "hi there"})
        assert done.type == "conversation.item.done", done
        assert done.item.role == "assistant"
        await add(conn, "user", said("and?"))
        # An audio part is taken by its transcript (the beta names, too).
        await add(conn, "assistant", {"type": "output_audio", "transcript": "well"})
        await add(conn, "assistant", {"type": "audio", "transcript": ", yes"})
        text = await answer(conn)
        assert text == "s:Be brief. u:hello a:hi there u:and? a:well a:, yes"


async def test_an_assistant_audio_part_without_its_transcript_is_refused(
    transcript: RunningServer,
) -> None:
    async with connection(transcript) as conn:
        await opened(conn, "")
        error = await add(conn, "assistant", {"type": "output_audio", "audio": "AAAA"})
        assert error.type == "error", error
        assert error.error.param == "item.content[0].transcript"
        error = await add(conn, "assistant", said("typed by the user?"))
        assert error.type == "error", error
        assert error.error.param == "item.content[0].type"
        await add(conn, "user", said("hello"))
        assert await answer(conn) == "u:hello"  # nothing of the refused items


async def test_a_responses_instructions_hold_for_it_alone(transcript: RunningServer) -> None:
    async with connection(transcript) as conn:
        await opened(conn, "Be brief.")
        await add(conn, "user", said("hello"))
        assert await answer(conn) == "s:Be brief. u:hello"
        await add(conn, "user", said("again"))
        text = await answer(conn, instructions="Shout.")
        assert text == "s:Be brief. u:hello a:#1 u:again r:Shout."
        await add(conn, "user", said("last"))
        # Neither the response's instructions nor the session's again: they stayed.
        assert await answer(conn) == "s:Be brief. u:hello a:#1 u:again a:#2 u:last"


async def test_after_an_assistant_item_an_earlier_reply_is_no_longer_the_last(
    transcript: RunningServer,
) -> None:
    async with connection(transcript) as conn:
        await opened(conn, "")
        await add(conn, "user", said("hello"))
        await conn.response.create()
        async for event in conn:
            if event.type == "response.done":
                replied = event.response.output[0].id
                break
        await add(conn, "assistant", {"type": "output_text", "text": "and more"})
        # The thinker's last reply is the one added: the earlier one cannot be cut.
        await conn.conversation.item.truncate(item_id=replied, content_index=0, audio_end_ms=0)
        async for event in conn:
            if event.type == "error":
                assert event.error.code == "item_truncate_invalid_item_id"
                break
            assert event.type != "conversation.item.truncated", event
        await add(conn, "user", said("so?"))
        assert await answer(conn) == "u:hello a:#1 a:and more u:so?"


async def test_truncate_cuts_the_items_transcript_to_what_was_heard(
    server: RunningServer,
) -> None:
    # scripted-omni: each thinker output ("t{k} ") is two codec frames of 80 ms.
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await client.send(
            "conversation.item.create",
            item={"type": "message", "role": "user", "content": [said("hello")]},
        )
        await client.send("response.create")
        events = await client.until("response.done")
        item = events[-1]["response"]["output"][0]
        assert item["content"][0]["transcript"].startswith("t0 t1 t2 t3 ")
        await client.send(
            "conversation.item.truncate", item_id=item["id"], content_index=0, audio_end_ms=400
        )
        truncated = await client.expect("conversation.item.truncated")
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (item["id"], 400)
        await client.send("conversation.item.retrieve", item_id=item["id"])
        retrieved = (await client.expect("conversation.item.retrieved"))["item"]
        assert retrieved["content"][0]["transcript"] == "t0 t1 t2 "  # 5 frames heard
