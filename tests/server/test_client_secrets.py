"""Ephemeral keys: ``POST /v1/realtime/client_secrets`` makes one with the server's key;
the websocket takes it until it expires, and its session starts from the bound config."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import websockets
from http_client import post
from realtime_client import connect
from websockets.exceptions import InvalidStatus

from omni_actors.protocols.realtime_client import SessionConfig
from omni_actors.server.ephemeral_keys import ClientSecrets
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings

KEY = "sk-test-123"
REAL = {"Authorization": f"Bearer {KEY}"}


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture
async def keyed() -> AsyncIterator[RunningServer]:
    async with run_server(ServerSettings(preset="scripted-omni", port=0, api_key=KEY)) as server:
        yield server


def _secrets_url(server: RunningServer) -> str:
    return server.url.rstrip("/") + "/v1/realtime/client_secrets"


async def _refused(server: RunningServer, token: str) -> dict[str, object]:
    """Open the websocket with ``token``: the handshake's 401 error object."""
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(
            server.ws_url, additional_headers={"Authorization": f"Bearer {token}"}
        ):
            pass
    assert refused.value.response.status_code == 401
    assert refused.value.response.body is not None
    error: dict[str, object] = json.loads(refused.value.response.body)["error"]
    return error


BOUND = {
    "type": "realtime",
    "max_output_tokens": 7,
    "output_modalities": ["text"],
    "audio": {"input": {"turn_detection": None}},
}


async def test_a_key_is_made_with_the_real_key_and_shows_its_session(
    keyed: RunningServer,
) -> None:
    status, body = await post(_secrets_url(keyed), {"session": BOUND})
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"
    status, body = await post(
        _secrets_url(keyed),
        {"expires_after": {"anchor": "created_at", "seconds": 60}, "session": BOUND},
        REAL,
    )
    assert status == 200, body
    assert set(body) == {"value", "expires_at", "session"}
    assert body["value"].startswith("ek_")
    assert body["session"]["max_output_tokens"] == 7
    assert body["session"]["output_modalities"] == ["text"]
    assert body["session"]["audio"]["input"]["turn_detection"] is None
    # An ephemeral key cannot make another.
    status, body = await post(
        _secrets_url(keyed), {"session": BOUND}, {"Authorization": f"Bearer {body['value']}"}
    )
    assert status == 401


async def test_a_bad_config_or_lifetime_is_refused_when_the_key_is_made(
    keyed: RunningServer,
) -> None:
    status, body = await post(
        _secrets_url(keyed), {"session": {"audio": {"output": {"speed": 2.0}}}}, REAL
    )
    assert status == 400
    assert body["error"]["param"] == "session.audio.output.speed"
    status, body = await post(
        _secrets_url(keyed), {"expires_after": {"anchor": "created_at", "seconds": 5}}, REAL
    )
    assert status == 400
    assert body["error"]["param"] == "expires_after.seconds"


async def test_the_websocket_takes_the_key_and_starts_from_its_config(
    keyed: RunningServer,
) -> None:
    _, body = await post(_secrets_url(keyed), {"session": BOUND}, REAL)
    token = body["value"]
    async with connect(keyed.ws_url, additional_headers={"Authorization": f"Bearer {token}"}) as c:
        session = c.seen[0]["session"]
        assert session["max_output_tokens"] == 7
        assert session["output_modalities"] == ["text"]
        assert session["audio"]["input"]["turn_detection"] is None
        # The config is the session's, not only its description: a reply is text alone.
        await c.send(
            "conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        )
        await c.send("response.create")
        events = await c.until("response.done")
        kinds = {e["type"] for e in events}
        assert "response.output_text.delta" in kinds
        assert "response.output_audio.delta" not in kinds
    # Browsers pass it as the key subprotocol; a key opens several sessions.
    async with connect(
        keyed.ws_url, subprotocols=["realtime", f"openai-insecure-api-key.{token}"]
    ) as c:
        assert c.seen[0]["session"]["max_output_tokens"] == 7


async def test_an_expired_or_unknown_key_is_refused_as_a_wrong_key_is(
    keyed: RunningServer,
) -> None:
    clock = Clock()
    keyed.state.client_secrets.clock = clock
    _, body = await post(
        _secrets_url(keyed), {"expires_after": {"anchor": "created_at", "seconds": 10}}, REAL
    )
    assert body["expires_at"] == int(clock.now) + 10
    token = body["value"]
    clock.now += 9
    async with connect(keyed.ws_url, additional_headers={"Authorization": f"Bearer {token}"}):
        pass
    clock.now += 1
    wrong = await _refused(keyed, "sk-wrong")
    assert await _refused(keyed, token) == wrong
    assert await _refused(keyed, "ek_unknown") == wrong
    assert wrong["code"] == "invalid_api_key"


def test_expired_keys_are_dropped() -> None:
    clock = Clock()
    store = ClientSecrets(clock=clock)
    for _ in range(100):
        store.issue(SessionConfig(), seconds=10)
    kept = store.issue(SessionConfig(), seconds=60)
    assert len(store) == 101
    clock.now += 10
    assert store.find(kept.value) == kept
    assert len(store) == 1
    assert len(store._expiry) == 1  # the expiry queue shrinks with it
