"""Who gets in and for how long: the API key, allowed origins, max sessions, idle
timeout, the input buffer cap, a client that vanishes, and a graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import websockets
from realtime_client import b64, connect, speech
from websockets.exceptions import ConnectionClosed, InvalidStatus

from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing import eventually

KEY = "sk-test-123"


def _settings(**changes: object) -> ServerSettings:
    return ServerSettings(preset="scripted-omni", port=0, **changes)  # type: ignore[arg-type]


def _error(refused: InvalidStatus) -> dict[str, object]:
    """The OpenAI-shaped error body of a refused handshake."""
    response = refused.response
    assert response.headers["content-type"] == "application/json"
    assert response.body is not None
    body = json.loads(response.body)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "code", "param"}
    error: dict[str, object] = body["error"]
    return error


async def test_the_api_key_is_checked_at_the_handshake() -> None:
    async with run_server(_settings(api_key=KEY)) as server:
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(server.ws_url):
                pass
        assert refused.value.response.status_code == 401
        assert _error(refused.value)["code"] == "invalid_api_key"
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(
                server.ws_url, additional_headers={"Authorization": "Bearer wrong"}
            ):
                pass
        assert refused.value.response.status_code == 401
        error = _error(refused.value)
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "invalid_api_key",
            None,
        )
        assert "API key" in error["message"]
        async with connect(
            server.ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}
        ) as client:
            assert client.seen[0]["type"] == "session.created"
        # Browsers pass it as a subprotocol; the server picks "realtime".
        async with connect(
            server.ws_url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]
        ) as client:
            assert client.ws.subprotocol == "realtime"


async def test_only_allowed_origins_may_connect() -> None:
    async with run_server(_settings(allowed_origins=("https://app.example",))) as server:
        own = server.url
        async with connect(server.ws_url, origin=own):
            pass
        async with connect(server.ws_url, origin="https://app.example"):
            pass
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(server.ws_url, origin="https://evil.example"):
                pass
        assert refused.value.response.status_code == 403
        error = _error(refused.value)
        assert (error["type"], error["code"]) == ("invalid_request_error", "origin_not_allowed")
        assert "https://evil.example" in error["message"]


async def test_one_session_too_many_gets_busy_not_a_hang() -> None:
    async with run_server(_settings(max_sessions=1)) as server, connect(server.ws_url):
        async with websockets.connect(server.ws_url) as second:
            async with asyncio.timeout(10):
                event = await second.recv()
            assert '"code":"busy"' in str(event)
            with pytest.raises(ConnectionClosed) as closed:
                async with asyncio.timeout(10):
                    await second.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1013
        assert server.state.active == 1


async def test_an_idle_session_is_closed() -> None:
    async with run_server(_settings(idle_timeout_s=0.3)) as server:
        async with connect(server.ws_url) as client:
            assert (await client.error())["code"] == "idle_timeout"
            with pytest.raises(ConnectionClosed):
                await client.recv(timeout=10)
        await eventually(lambda: server.state.active == 0, what="the slot is given back")


async def test_the_input_buffer_is_capped_and_an_append_past_it_is_refused() -> None:
    settings = _settings(max_input_buffer_s=1.0)
    async with run_server(settings) as server, connect(server.ws_url) as client:
        await client.no_vad()
        await client.send("input_audio_buffer.append", audio=b64(speech(0.8)))
        await client.send("input_audio_buffer.append", event_id="over", audio=b64(speech(0.5)))
        error = await client.error()
        assert error["code"] == "input_audio_buffer_full"
        assert error["event_id"] == "over"
        await client.send("input_audio_buffer.commit")  # what was taken is kept
        await client.expect("input_audio_buffer.committed")


async def test_a_client_that_vanishes_mid_response_leaves_nothing(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.ask(0.2)
        await client.until("response.output_audio.delta")
    pipeline = server.state.pipeline

    async def nothing_left() -> bool:
        sessions = await pipeline.live_sessions()
        held = await pipeline.inspect()
        return not any(sessions.values()) and not any(s.keys for s in held.values())

    await eventually(nothing_left, timeout=10, what="every stage dropped the session")
    assert server.state.active == 0
    assert not server.state.connections


async def test_shutdown_lets_the_response_finish_then_closes_with_a_final_event() -> None:
    async with run_server(_settings(grace_s=10)) as server, connect(server.ws_url) as client:
        await client.ask(0.2)
        await client.until("response.output_audio.delta")
        stopping = asyncio.create_task(server.shutdown())
        try:
            events = await client.until("response.done")
            assert events[-1]["response"]["status"] == "completed"
            final = await client.error()
            assert final["code"] == "server_shutting_down"
            with pytest.raises(ConnectionClosed) as closed:
                await client.recv(timeout=10)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1001
        finally:
            await stopping


async def test_leaving_before_uvicorn_has_started_shuts_down_cleanly() -> None:
    # The block is left before the uvicorn task has run a step: it has bound no listener
    # yet, and the shutdown must neither fail on that nor leave it running.
    async with run_server(_settings()) as server:
        port = int(server.url.rsplit(":", 1)[1])
        assert not server._server.started
    assert server._task.done()
    assert server._task.exception() is None
    with socket.socket() as probe:  # the listening socket is closed: nothing answers
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    # The next server starts and stops as usual (the autouse check: no task left).
    async with run_server(_settings()) as server, connect(server.ws_url) as client:
        await client.ask(0.2)
        await client.until("response.done")
