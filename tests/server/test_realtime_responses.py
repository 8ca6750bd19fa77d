"""Responses over ``/v1/realtime``: event order and ids, cancel and barge-in, truncate,
server VAD turns, output formats and beta names."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from realtime_client import audio_deltas, b64, connect, silence, speech

from omni_actors.server.runner import RunningServer

RESPONSE_ORDER = [
    "response.created",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.done",
]


def _created(events: list[dict[str, Any]]) -> str:
    """The id of the response created among ``events``."""
    created = [e for e in events if e["type"] == "response.created"]
    assert len(created) == 1, events
    response_id: str = created[0]["response"]["id"]
    return response_id


def _openai_parses(events: list[dict[str, object]]) -> None:
    """Every event validates against the official client's GA models."""
    adapter: TypeAdapter[object] = TypeAdapter(RealtimeServerEvent)
    for event in events:
        adapter.validate_json(msgspec.json.encode(event))


async def test_a_response_streams_in_the_documented_order_with_stable_ids(
    server: RunningServer,
) -> None:
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await client.say(speech(0.3))
        await client.send("input_audio_buffer.commit", event_id="c1")
        committed = await client.expect("input_audio_buffer.committed")
        added = await client.expect("conversation.item.added")
        assert added["item"]["id"] == committed["item_id"]
        assert added["item"]["role"] == "user"
        await client.expect("conversation.item.done")
        await client.send("response.create", event_id="r1")
        events = await client.until("response.done")
    types = [e["type"] for e in events]
    assert types[:3] == RESPONSE_ORDER
    assert types[-5:] == CLOSING
    middle = set(types[3:-5])
    assert middle == {"response.output_audio.delta", "response.output_audio_transcript.delta"}
    response_id = events[0]["response"]["id"]
    item_id = events[1]["item"]["id"]
    for event in events[1:-1]:
        assert event["response_id"] == response_id
        if "item_id" in event:
            assert event["item_id"] == item_id
    done = events[-1]["response"]
    assert done["id"] == response_id
    assert done["status"] == "completed"
    assert done["output"][0]["id"] == item_id
    transcript = "".join(
        e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"
    )
    assert events[-4]["transcript"] == transcript  # the transcript's done event
    assert done["usage"]["output_tokens"] > 0
    assert len({e["event_id"] for e in events}) == len(events)  # every event_id unique
    for delta in audio_deltas(events):
        assert len(base64.b64decode(delta["delta"])) % 2 == 0
    _openai_parses(events)


async def test_cancel_ends_the_response_and_no_audio_of_it_follows(
    server: RunningServer,
) -> None:
    async with connect(server.ws_url) as client:
        await client.ask(0.2)
        before = await client.until("response.output_audio.delta")
        response_id = _created(before)
        await client.send("response.cancel", event_id="x1")
        after = await client.until("response.done")
        done = after[-1]["response"]
        assert done["status"] == "cancelled"
        assert done["status_details"] == {
            "type": "cancelled",
            "reason": "client_cancelled",
            "error": None,
        }
        assert done["output"][0]["status"] == "incomplete"
        # Nothing of the cancelled response after its response.done: the next events are
        # the next response's (an ordering assertion, not a timed one).
        await client.send("response.create")
        following = await client.until("response.done")
        assert all(e.get("response_id") != response_id for e in following), (
            "an event of the cancelled response came after its response.done"
        )
        assert following[-1]["response"]["status"] == "completed"
        assert following[-1]["response"]["id"] != response_id


async def test_a_second_response_while_one_is_in_flight_is_refused(
    server: RunningServer,
) -> None:
    async with connect(server.ws_url) as client:
        await client.ask(0.1)
        await client.until("response.created")
        await client.send("response.create", event_id="again")
        events = await client.until("error")
        assert events[-1]["error"]["code"] == "conversation_already_has_active_response"
        assert events[-1]["error"]["event_id"] == "again"
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "completed"


async def test_cancel_with_no_response_is_an_error_naming_the_event(
    server: RunningServer,
) -> None:
    async with connect(server.ws_url) as client:
        await client.send("response.cancel", event_id="nothing")
        error = await client.error()
        assert error["code"] == "response_cancel_not_active"
        assert error["event_id"] == "nothing"
        assert error["type"] == "invalid_request_error"


async def test_server_vad_commits_and_answers_a_spoken_turn(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.say(silence(0.5) + speech(0.8) + silence(1.0), frame_s=0.02)
        events = await client.until("response.done")
    types = [e["type"] for e in events]
    started = types.index("input_audio_buffer.speech_started")
    stopped = types.index("input_audio_buffer.speech_stopped")
    committed = types.index("input_audio_buffer.committed")
    assert started < stopped < committed < types.index("response.created")
    item = events[started]["item_id"]
    assert events[stopped]["item_id"] == item == events[committed]["item_id"]
    # Speech began 500 ms in; the start includes the 300 ms prefix padding.
    assert 100 <= events[started]["audio_start_ms"] <= 500
    assert events[stopped]["audio_end_ms"] >= 1300
    assert events[-1]["response"]["status"] == "completed"


async def test_speech_during_a_response_cancels_it_turn_detected(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.say(speech(0.6) + silence(0.8), frame_s=0.02)
        first = await client.until("response.output_audio.delta")
        response_id = _created(first)
        await client.say(speech(0.3), frame_s=0.02)  # the user speaks again: barge-in
        events = await client.until("response.done")
        while events[-1]["response"]["id"] != response_id:
            events = await client.until("response.done")
        assert "input_audio_buffer.speech_started" in [e["type"] for e in client.seen]
        done = events[-1]["response"]
        assert done["status"] == "cancelled"
        assert done["status_details"]["reason"] == "turn_detected"


async def test_truncate_cuts_the_last_reply_and_checks_its_arguments(
    server: RunningServer,
) -> None:
    async with connect(server.ws_url) as client:
        await client.ask(0.2)
        events = await client.until("response.done")
        item_id = events[-1]["response"]["output"][0]["id"]
        await client.send(
            "conversation.item.truncate", event_id="t0", item_id="nope", audio_end_ms=10
        )
        assert (await client.error())["code"] == "item_truncate_invalid_item_id"
        await client.send(
            "conversation.item.truncate", event_id="t1", item_id=item_id, audio_end_ms=10**9
        )
        error = await client.error()
        assert error["code"] == "invalid_value"
        assert error["event_id"] == "t1"
        await client.send(
            "conversation.item.truncate", event_id="t2", item_id=item_id, audio_end_ms=20
        )
        truncated = await client.expect("conversation.item.truncated")
        assert truncated["item_id"] == item_id
        assert truncated["audio_end_ms"] == 20
        await client.send("response.create")  # the conversation goes on
        assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
async def test_g711_in_and_out(server: RunningServer, fmt: str) -> None:
    async with connect(server.ws_url) as client:
        await client.send(
            "session.update",
            session={
                "type": "realtime",
                "audio": {
                    "input": {"format": {"type": fmt}, "turn_detection": None},
                    "output": {"format": {"type": fmt}},
                },
            },
        )
        updated = await client.expect("session.updated")
        assert updated["session"]["audio"]["output"]["format"]["type"] == fmt
        await client.send("input_audio_buffer.append", audio=b64(bytes([0x55] * 1600)))
        await client.send("response.create")
        events = await client.until("response.done")
    assert events[-1]["response"]["status"] == "completed"
    pcm = [e for e in events if e["type"] == "response.output_audio.delta"]
    pcm16 = await _pcm16_samples(server)
    got = sum(len(base64.b64decode(e["delta"])) for e in pcm)  # one byte per sample
    assert abs(got - pcm16 / 3) <= 16  # 24 kHz -> 8 kHz


async def _pcm16_samples(server: RunningServer) -> int:
    async with connect(server.ws_url) as client:
        await client.no_vad()
        await client.send("input_audio_buffer.append", audio=b64(speech(0.2)))
        await client.send("response.create")
        events = await client.until("response.done")
    return sum(len(base64.b64decode(e["delta"])) // 2 for e in audio_deltas(events))


async def test_a_beta_client_gets_beta_event_names(server: RunningServer) -> None:
    async with connect(server.ws_url, additional_headers={"OpenAI-Beta": "realtime=v1"}) as client:
        await client.send(
            "session.update",
            session={"modalities": ["text", "audio"], "input_audio_format": "pcm16",
                     "turn_detection": None, "voice": "alloy"},
        )  # fmt: skip
        updated = await client.expect("session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        assert updated["session"]["audio"]["output"]["voice"] == "alloy"
        await client.say(speech(0.1))
        await client.send("response.create")
        events = await client.until("response.done")
    types = {e["type"] for e in events}
    assert {"response.audio.delta", "response.audio_transcript.delta"} <= types
    assert "response.output_audio.delta" not in types


async def test_text_only_responses_carry_text_events(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.ask(0.1, output_modalities=["text"])
        events = await client.until("response.done")
    types = [e["type"] for e in events]
    assert "response.output_text.delta" in types
    assert "response.output_text.done" in types
    assert "response.output_audio.delta" not in types
    assert events[-1]["response"]["output_modalities"] == ["text"]
    _openai_parses(events)


async def test_truncating_the_reply_in_flight_cancels_it_then_cuts_it(
    server: RunningServer,
) -> None:
    """What a client does on barge-in: truncate as soon as the user speaks."""
    async with connect(server.ws_url) as client:
        await client.ask(0.2)
        events = await client.until("response.output_audio.delta")
        item_id = events[-1]["item_id"]
        await client.send(
            "conversation.item.truncate", event_id="cut", item_id=item_id, audio_end_ms=0
        )
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "cancelled"
        # The cut is confirmed once the response has ended on every stage.
        events += await client.until("conversation.item.truncated")
        assert "error" not in [e["type"] for e in events]
        await client.send("response.create")  # the conversation goes on, cut
        events = await client.until("response.done")
        assert "error" not in [e["type"] for e in events]
        assert events[-1]["response"]["status"] == "completed"
