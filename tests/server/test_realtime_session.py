"""Session settings, the input buffer and items over ``/v1/realtime``, and bad input:
every bad event gets an ``error`` naming it, and the session goes on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from realtime_client import RealtimeClient, b64, connect, speech

from omni_actors.server.runner import RunningServer


async def _still_serves(client: RealtimeClient) -> None:
    """The session goes on: a turn is answered."""
    await client.send("input_audio_buffer.append", audio=b64(speech(0.1)))
    await client.send("response.create")
    events = await client.until("response.done")
    assert events[-1]["response"]["status"] == "completed"


async def test_session_created_then_updated_in_the_ga_form(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        created = client.seen[0]["session"]
        assert created["type"] == "realtime"
        assert created["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert created["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        assert created["output_modalities"] == ["audio"]
        await client.send(
            "session.update",
            event_id="u1",
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "max_output_tokens": 7,
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}},
                    "output": {"voice": "ethan"},
                },
            },
        )
        session = (await client.expect("session.updated"))["session"]
        assert session["id"] == created["id"]
        assert session["output_modalities"] == ["text"]
        assert session["max_output_tokens"] == 7
        vad = session["audio"]["input"]["turn_detection"]
        assert vad["silence_duration_ms"] == 300
        assert vad["threshold"] == 0.5  # untouched settings keep their values
        assert session["audio"]["output"]["voice"] == "ethan"


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"audio": {"input": {"format": {"type": "audio/flac"}}}},
         "session.audio.input.format.type"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
         "session.audio.input.format.rate"),
        ({"input_audio_format": "opus"}, "session.input_audio_format"),
        ({"audio": {"input": {"turn_detection": {"threshold": 3}}}},
         "session.audio.input.turn_detection.threshold"),
        ({"max_output_tokens": 0}, "session.max_output_tokens"),
        # Settings the server cannot honour are refused, never changed without a word:
        # semantic_vad without Silero VAD (conftest.py makes it absent here).
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
         "session.audio.input.turn_detection.type"),
        ({"turn_detection": {"type": "semantic_vad", "eagerness": "low"}},
         "session.audio.input.turn_detection.type"),
        ({"audio": {"output": {"speed": 1.5}}}, "session.audio.output.speed"),
        ({"speed": 0.8}, "session.speed"),
        # scripted-omni's thinker takes no instructions.
        ({"instructions": "Be brief."}, "session.instructions"),
    ],
)  # fmt: skip
async def test_a_bad_update_is_refused_whole_and_changes_nothing(
    server: RunningServer, session: dict[str, Any], param: str
) -> None:
    async with connect(server.ws_url) as client:
        before = client.seen[0]["session"]
        await client.send(
            "session.update", event_id="bad", session={**session, "instructions": "changed?"}
        )
        error = await client.error()
        assert error["code"] == "invalid_value"
        assert error["param"] == param
        assert error["event_id"] == "bad"
        await client.send("session.update", session={})
        after = (await client.expect("session.updated"))["session"]
        assert after["instructions"] == before["instructions"]
        assert after["audio"] == before["audio"]


async def test_a_response_at_another_speed_is_refused_by_name(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await client.send(
            "response.create", event_id="fast", response={"audio": {"output": {"speed": 2.0}}}
        )
        error = await client.error()
        assert (error["param"], error["event_id"]) == ("response.audio.output.speed", "fast")
        # At 1 it is taken: the reply is spoken at the model's own pace anyway.
        await client.send("response.create", response={"audio": {"output": {"speed": 1.0}}})
        assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"


async def test_commit_clear_and_their_errors(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await client.send("input_audio_buffer.commit", event_id="empty")
        error = await client.error()
        assert error["code"] == "input_audio_buffer_commit_empty"
        assert error["event_id"] == "empty"
        await client.say(speech(0.2))
        await client.send("input_audio_buffer.clear")
        await client.expect("input_audio_buffer.cleared")
        await client.send("input_audio_buffer.commit", event_id="cleared")
        assert (await client.error())["code"] == "input_audio_buffer_commit_empty"
        await client.say(speech(0.2))
        await client.send("input_audio_buffer.commit")
        committed = await client.expect("input_audio_buffer.committed")
        added = await client.expect("conversation.item.added")
        assert added["item"]["id"] == committed["item_id"]
        assert added["item"]["content"][0]["type"] == "input_audio"
        assert (await client.expect("conversation.item.done"))["item"]["status"] == "completed"
        await client.say(speech(0.2))
        await client.send("input_audio_buffer.commit")
        second = await client.expect("input_audio_buffer.committed")
        assert second["previous_item_id"] == committed["item_id"]


async def test_items_user_text_and_audio_system_and_refused_roles(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await client.send(
            "conversation.item.create",
            item={"type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": "hello"}]},
        )  # fmt: skip
        added = await client.expect("conversation.item.added")
        assert added["item"]["role"] == "user"
        assert added["item"]["content"][0]["text"] == "hello"
        await client.expect("conversation.item.done")
        await client.send(
            "conversation.item.create",
            item={"type": "message", "role": "user",
                  "content": [{"type": "input_audio", "audio": b64(speech(0.1))}]},
        )  # fmt: skip
        second = await client.expect("conversation.item.added")
        assert second["previous_item_id"] == added["item"]["id"]
        await client.expect("conversation.item.done")
        for event_id, item in [
            # scripted-omni's thinker takes no instructions: refused, not ignored.
            ("sys", {"type": "message", "role": "system",
                     "content": [{"type": "input_text", "text": "Be brief."}]}),
            ("asst", {"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": "hi"}]}),
            ("call", {"type": "function_call", "name": "f"}),
            ("none", {"type": "message", "role": "user", "content": []}),
        ]:  # fmt: skip
            await client.send("conversation.item.create", event_id=event_id, item=item)
            error = await client.error()
            assert error["event_id"] == event_id
        await client.send("response.create")
        assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"


BAD_EVENTS: list[tuple[str | bytes, str]] = [
    ("not json", "invalid_json"),
    ('["an", "array"]', "invalid_event"),
    ('{"no": "type"}', "invalid_event"),
    (json.dumps({"type": "session.destroy", "event_id": "e1"}), "unknown_event"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e2"}), "invalid_event"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e3", "audio": 5}),
     "invalid_event"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e4", "audio": "@@@"}),
     "invalid_audio"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e6", "audio": "AAEC"}),
     "invalid_audio"),  # 3 bytes: an odd PCM16 byte count
    (json.dumps({"type": "conversation.item.truncate", "event_id": "e7", "item_id": "x",
                 "audio_end_ms": "soon"}), "invalid_event"),
    (b"\x00binary", "invalid_event"),
]  # fmt: skip


@pytest.mark.parametrize(("frame", "code"), BAD_EVENTS)
async def test_bad_input_gets_an_error_and_the_session_goes_on(
    server: RunningServer, frame: str | bytes, code: str
) -> None:
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await client.send_raw(frame)
        error = await client.error()
        assert error["code"] == code, error
        assert error["type"] == "invalid_request_error"
        if isinstance(frame, str) and '"event_id"' in frame:
            assert error["event_id"] == json.loads(frame)["event_id"]
        await _still_serves(client)


async def test_an_oversized_message_is_refused_and_the_session_goes_on() -> None:
    from omni_actors.server.runner import run_server
    from omni_actors.server.settings import ServerSettings

    settings = ServerSettings(preset="scripted-omni", port=0, max_message_bytes=50_000)
    async with run_server(settings) as server, connect(server.ws_url) as client:
        await client.no_vad()
        await client.send("input_audio_buffer.append", audio=b64(speech(1.0)))  # 64 KB
        assert (await client.error())["code"] == "message_too_large"
        await _still_serves(client)


async def test_an_oversized_append_is_refused_before_decoding() -> None:
    from omni_actors.server.runner import run_server
    from omni_actors.server.settings import ServerSettings

    settings = ServerSettings(preset="scripted-omni", port=0, max_append_bytes=10_000)
    async with run_server(settings) as server, connect(server.ws_url) as client:
        await client.no_vad()
        await client.send("input_audio_buffer.append", event_id="big", audio=b64(speech(0.5)))
        error = await client.error()
        assert error["code"] == "invalid_audio"
        assert error["event_id"] == "big"
        await _still_serves(client)
