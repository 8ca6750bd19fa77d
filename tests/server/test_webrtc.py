"""WebRTC calls (``POST /v1/realtime/calls``), from an aiortc caller as a browser calls.

The caller offers its microphone and the ``oai-events`` data channel; the server answers,
hears the microphone through its VAD, plays the reply on its track in real time, and
sends the session's events on the channel (no audio deltas: the audio is on the track).
A barge-in or ``response.cancel`` cuts the reply where the caller stopped hearing it.
The pipeline is scripted-omni with a tone for audio (``webrtc_engines``): each text
output ``t{k} `` is two 80 ms codec frames of it.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from aiortc import RTCConfiguration, RTCPeerConnection
from webrtc_client import call, post_offer, speech
from webrtc_engines import one_torch_thread, tone_pipeline

import omni_actors.server
from omni_actors.server import webrtc_call
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing.waiting import consistently, eventually

KEY = "sk-webrtc-test"
MS_PER_OUTPUT = 160  # one text output: two 80 ms codec frames


@pytest.fixture(autouse=True)
def _as_served() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest_asyncio.fixture
async def tone() -> AsyncIterator[RunningServer]:
    settings = ServerSettings(port=0, api_key=KEY)
    async with run_server(settings, pipeline=tone_pipeline()) as running:
        yield running


def heard_text(audio_ms: int) -> str:
    """The reply's text the caller heard of its first ``audio_ms``: the outputs whose
    audio began."""
    return "".join(f"t{k} " for k in range(math.ceil(audio_ms / MS_PER_OUTPUT)))


async def test_a_call_hears_the_caller_and_plays_the_reply(tone: RunningServer) -> None:
    async with call(tone.url, key=KEY) as caller:
        created = await caller.expect("session.created")
        assert created["session"]["type"] == "realtime"
        caller.mic.say(speech(1.0))
        events = await caller.until("response.done")
        types = [e["type"] for e in events]
        assert (
            types.index("input_audio_buffer.speech_started")
            < types.index("input_audio_buffer.committed")
            < types.index("response.created")
        )
        done = events[-1]["response"]
        assert done["status"] == "completed", done
        transcript = done["output"][0]["content"][0]["transcript"]
        assert transcript == heard_text(32 * MS_PER_OUTPUT)
        assert "response.output_audio.delta" not in types  # the audio is on the track
        assert "response.output_audio_transcript.delta" in types
        # The whole reply (5.12 s) plays on the track, at real time: though it was all
        # generated in about 2 s, it takes as long to arrive as to play.
        await eventually(lambda: caller.heard_ms > 4500, timeout=20, what="the reply heard")
        assert caller.first_loud_at is not None
        took_s = time.monotonic() - caller.first_loud_at
        assert took_s >= 0.9 * caller.heard_ms / 1000, (took_s, caller.heard_ms)
        # The playout's start and end are told, as OpenAI tells a WebRTC client.
        started = next(e for e in caller.seen if e["type"] == "output_audio_buffer.started")
        assert started["response_id"] == done["id"]
        stopped = (await caller.until("output_audio_buffer.stopped"))[-1]
        assert stopped["response_id"] == done["id"]


@pytest.mark.parametrize(
    ("how", "per_output_s", "status"),
    [
        ("barge_in", 0.5, "cancelled"),  # while the reply is generated
        ("barge_in", 0.01, "completed"),  # generated, still playing
        ("response.cancel", 0.5, "cancelled"),
        ("response.cancel", 0.01, "completed"),  # generated, still playing
        ("output_audio_buffer.clear", 0.5, "cancelled"),
        ("output_audio_buffer.clear", 0.01, "completed"),
    ],
)
async def test_a_cut_reply_is_truncated_at_what_the_caller_heard(
    how: str, per_output_s: float, status: str
) -> None:
    settings = ServerSettings(port=0, api_key=KEY)
    async with (
        run_server(settings, pipeline=tone_pipeline(per_output_s)) as server,
        call(server.url, key=KEY) as caller,
    ):
        await caller.expect("session.created")
        caller.mic.say(speech(1.0))
        await caller.until("response.created", timeout=40)
        # Deadlines for a loaded machine: there the server's track may run slower than
        # real time (aiortc encodes each frame in Python), and what it sent is what counts.
        await eventually(lambda: caller.heard_ms > 1200, timeout=40, what="the reply playing")
        if how == "barge_in":
            caller.mic.say(speech(2.0))  # its own reply comes well after the checks below
        else:
            await caller.send(how)
        events = await caller.until("conversation.item.truncated", timeout=40)
        heard_ms = caller.heard_ms
        types = [e["type"] for e in events]
        if how == "barge_in":
            assert "input_audio_buffer.speech_started" in types
        done = next(e for e in caller.seen if e["type"] == "response.done")["response"]
        assert done["status"] == status, done
        reply = done["output"][0]
        truncated = events[-1]
        assert truncated["item_id"] == reply["id"]
        cut_ms = truncated["audio_end_ms"]
        # Cut where the caller was: what it had heard, and the frames on their way.
        assert 1200 <= cut_ms < 32 * MS_PER_OUTPUT
        assert heard_ms - 60 <= cut_ms <= heard_ms + 200, (cut_ms, heard_ms)
        await caller.send("conversation.item.retrieve", item_id=reply["id"])
        if not any(e["type"] == "output_audio_buffer.cleared" for e in caller.seen):
            await caller.until("output_audio_buffer.cleared")
        cleared = next(e for e in caller.seen if e["type"] == "output_audio_buffer.cleared")
        assert cleared["response_id"] == done["id"]
        # (A barge-in's speech gets its own reply meanwhile: its events come on the way.)
        retrieved = (await caller.until("conversation.item.retrieved"))[-1]
        assert retrieved["item"]["content"][0]["transcript"] == heard_text(cut_ms)
        # The caller hears the frames in flight, then nothing more of it: all it heard
        # is what the item keeps, to a frame or two (20 ms each, Opus's edges).
        await eventually(lambda: caller.heard_ms >= cut_ms - 60, what="the frames in flight")
        await consistently(lambda: caller.heard_ms <= cut_ms + 60, 0.5, what="the reply stopped")


async def test_an_ephemeral_key_opens_a_call_with_its_config_and_the_calls_own(
    tone: RunningServer,
) -> None:
    async with httpx.AsyncClient(base_url=tone.url, timeout=20) as http:
        minted = await http.post(
            "/v1/realtime/client_secrets",
            json={"session": {"type": "realtime", "max_output_tokens": 7}},
            headers={"Authorization": f"Bearer {KEY}"},
        )
    assert minted.status_code == 200, minted.text
    ephemeral = minted.json()["value"]
    own = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    async with call(tone.url, key=ephemeral, session=own) as caller:
        session = (await caller.expect("session.created"))["session"]
        assert session["max_output_tokens"] == 7  # the key's
        assert session["audio"]["input"]["turn_detection"] is None  # the call's


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({}, b"v=0", 401, "invalid_api_key"),
        ({"Authorization": "Bearer ek_expired"}, b"v=0", 401, "invalid_api_key"),
        ({"Authorization": f"Bearer {KEY}"}, b"", 400, "invalid_request"),
        ({"Authorization": f"Bearer {KEY}"}, b"not sdp", 400, "invalid_offer"),
        (
            {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
            b"{}",
            400,
            "invalid_request",
        ),
    ],
)
async def test_a_call_without_the_key_or_an_offer_is_refused(
    tone: RunningServer, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    headers = {"Content-Type": "application/sdp", **headers}
    async with httpx.AsyncClient(base_url=tone.url, timeout=20) as http:
        reply = await http.post("/v1/realtime/calls", content=body, headers=headers)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["code"] == code
    assert len(tone.state.calls) == 0
    assert tone.state.active == 0


async def test_without_aiortc_a_call_is_told_what_to_install(
    tone: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a server without the webrtc extra meets: aiortc does not import.
    monkeypatch.setitem(sys.modules, "aiortc", None)
    monkeypatch.delitem(sys.modules, "omni_actors.server.webrtc_call", raising=False)
    monkeypatch.delattr(omni_actors.server, "webrtc_call", raising=False)
    async with httpx.AsyncClient(base_url=tone.url, timeout=20) as http:
        reply = await http.post(
            "/v1/realtime/calls",
            content=b"v=0\r\n",
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"},
        )
    assert reply.status_code == 501, reply.text
    error = reply.json()["error"]
    assert error["code"] == "webrtc_not_installed"
    assert "pip install 'omni-actors[webrtc]'" in error["message"]
    assert tone.state.active == 0


@pytest.fixture
def peer_connections(monkeypatch: pytest.MonkeyPatch) -> list[RTCPeerConnection]:
    """The server's peer connections, as it makes them."""
    made: list[RTCPeerConnection] = []

    class Recorded(RTCPeerConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(webrtc_call, "RTCPeerConnection", Recorded)
    return made


def _nothing_left(server: RunningServer, peer_connections: list[RTCPeerConnection]) -> None:
    state = server.state
    assert len(state.calls) == 0
    assert not state.connections
    assert state.active == 0
    assert peer_connections
    assert all(pc.connectionState == "closed" for pc in peer_connections)


async def test_a_hang_up_ends_the_call_and_its_session(
    tone: RunningServer, peer_connections: list[RTCPeerConnection]
) -> None:
    async with call(tone.url, key=KEY) as caller:
        await caller.expect("session.created")
        assert len(tone.state.calls) == 1
        async with httpx.AsyncClient(base_url=tone.url, timeout=20) as http:
            hung = await http.post(
                caller.location + "/hangup", headers={"Authorization": f"Bearer {KEY}"}
            )
            assert hung.status_code == 200, hung.text
            _nothing_left(tone, peer_connections)  # the hang-up returns once the call is closed
            again = await http.post(
                caller.location + "/hangup", headers={"Authorization": f"Bearer {KEY}"}
            )
            assert again.status_code == 404
        async with asyncio.timeout(20):
            await caller.closed.wait()


async def test_the_caller_closing_its_data_channel_ends_the_call(
    tone: RunningServer, peer_connections: list[RTCPeerConnection]
) -> None:
    async with call(tone.url, key=KEY) as caller:
        await caller.expect("session.created")
        caller.channel.close()
        await eventually(
            lambda: _nothing_left(tone, peer_connections), timeout=20, what="the call ended"
        )


async def test_the_caller_leaving_ends_the_call(
    tone: RunningServer, peer_connections: list[RTCPeerConnection]
) -> None:
    async with call(tone.url, key=KEY) as caller:
        await caller.expect("session.created")
    await eventually(
        lambda: _nothing_left(tone, peer_connections), timeout=30, what="the call ended"
    )


async def test_a_server_stopping_ends_its_calls(
    peer_connections: list[RTCPeerConnection],
) -> None:
    settings = ServerSettings(port=0, api_key=KEY)
    async with (
        run_server(settings, pipeline=tone_pipeline()) as server,
        call(server.url, key=KEY) as caller,
    ):
        await caller.expect("session.created")
        await server.shutdown()
        _nothing_left(server, peer_connections)
        error = await caller.expect("error")
        assert error["error"]["code"] == "server_shutting_down"
        async with asyncio.timeout(20):
            await caller.closed.wait()


async def test_a_call_hung_up_before_its_caller_connects_is_closed(
    tone: RunningServer, peer_connections: list[RTCPeerConnection]
) -> None:
    # The caller posts its offer, then closes before the connection is made.
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        reply = await post_offer(tone.url, pc.localDescription.sdp, key=KEY)
        assert reply.status_code == 201, reply.text
        assert len(tone.state.calls) == 1
    finally:
        await pc.close()
    async with httpx.AsyncClient(base_url=tone.url, timeout=20) as http:
        hung = await http.post(
            reply.headers["location"] + "/hangup", headers={"Authorization": f"Bearer {KEY}"}
        )
    assert hung.status_code == 200
    _nothing_left(tone, peer_connections)


async def test_a_call_without_audio_gets_its_audio_in_events(tone: RunningServer) -> None:
    # A data channel alone: the session's audio travels as on the websocket.
    async with call(tone.url, key=KEY, microphone=False) as caller:
        await caller.expect("session.created")
        await caller.send(
            "conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        )
        await caller.send("response.create")
        events = await caller.until("response.done")
        assert "response.output_audio.delta" in [e["type"] for e in events]
        assert events[-1]["response"]["status"] == "completed"


async def test_a_session_ending_ends_its_call(peer_connections: list[RTCPeerConnection]) -> None:
    # No microphone and no event for idle_timeout_s: the session ends, and the call too.
    settings = ServerSettings(port=0, api_key=KEY, idle_timeout_s=1.0)
    async with (
        run_server(settings, pipeline=tone_pipeline()) as server,
        call(server.url, key=KEY, microphone=False) as caller,
    ):
        await caller.expect("session.created")
        error = await caller.expect("error")
        assert error["error"]["code"] == "idle_timeout"
        async with asyncio.timeout(20):
            await caller.closed.wait()
        await eventually(
            lambda: _nothing_left(server, peer_connections), timeout=20, what="the call ended"
        )


async def test_a_callers_audio_keeps_its_session_from_idling() -> None:
    # A caller who only speaks sends no event: its microphone is what the client did.
    settings = ServerSettings(port=0, api_key=KEY, idle_timeout_s=1.0)
    async with (
        run_server(settings, pipeline=tone_pipeline()) as server,
        call(server.url, key=KEY) as caller,
    ):
        await caller.expect("session.created")
        await consistently(lambda: not caller.closed.is_set(), 2.5, what="the call stays")
        assert len(server.state.calls) == 1
