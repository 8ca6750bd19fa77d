"""``turn_detection`` over ``/v1/realtime``: the session says which detector runs,
``semantic_vad`` is served on Smart Turn or refused by ``param`` (never changed without a
word), and ``idle_timeout_ms: null`` turns the idle timeout off."""

from __future__ import annotations

import asyncio
import base64
import sys
import threading
from typing import Any

import pytest
import torch
from openai import AsyncOpenAI
from realtime_client import DEADLINE_S, connect
from spoken import need_espeak, say, silence
from test_turn_models import SENTENCE

from omni_actors.server import turn_models
from omni_actors.server.runner import RunningServer
from omni_actors.server.turns import EAGERNESS

PARAM = "session.audio.input.turn_detection"
RATE = 24_000


def _vad(session: dict[str, Any]) -> dict[str, Any]:
    detection: dict[str, Any] = session["audio"]["input"]["turn_detection"]
    return detection


def _need_models() -> None:
    if turn_models.smart_turn_model() is None or turn_models.silero_model() is None:
        pytest.skip("Silero VAD and Smart Turn are not installed (extra semantic-vad)")


async def test_without_silero_vad_the_session_says_the_energy_vad_runs(
    server: RunningServer,
) -> None:
    # tests/server/conftest.py makes silero_vad absent for the unmarked tests.
    async with connect(server.ws_url) as client:
        vad = _vad(client.seen[0]["session"])
        assert (vad["type"], vad["detector"]) == ("server_vad", "frame-energy")


@pytest.mark.real_speech
async def test_with_silero_vad_the_session_says_silero_runs(server: RunningServer) -> None:
    _need_models()
    async with connect(server.ws_url) as client:
        vad = _vad(client.seen[0]["session"])
        assert (vad["type"], vad["detector"]) == ("server_vad", "silero-vad")
        assert vad["threshold"] == 0.5


@pytest.mark.real_speech
async def test_semantic_vad_is_taken_and_shown_with_its_eagerness(server: RunningServer) -> None:
    _need_models()
    async with connect(server.ws_url) as client:
        await client.send(
            "session.update",
            session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "semantic_vad", "eagerness": "high", "create_response": False,
            }}}},
        )  # fmt: skip
        vad = _vad((await client.expect("session.updated"))["session"])
        assert vad["type"] == "semantic_vad"
        assert vad["eagerness"] == "high"
        assert vad["create_response"] is False
        assert vad["detector"] == "silero-vad+smart-turn-v3.2"
        # An update of the type in force changes what it names.
        await client.send("session.update", session={"turn_detection": {"type": "semantic_vad"}})
        vad = _vad((await client.expect("session.updated"))["session"])
        assert (vad["eagerness"], vad["create_response"]) == ("high", False)


@pytest.mark.real_speech
@pytest.mark.parametrize(
    ("detection", "param"),
    [
        ({"type": "semantic_vad", "threshold": 0.7}, PARAM + ".threshold"),
        ({"type": "semantic_vad", "silence_duration_ms": 200}, PARAM + ".silence_duration_ms"),
        ({"type": "semantic_vad", "idle_timeout_ms": 5000}, PARAM + ".idle_timeout_ms"),
        ({"type": "semantic_vad", "eagerness": "eager"}, PARAM + ".eagerness"),
        ({"type": "server_vad", "eagerness": "low"}, PARAM + ".eagerness"),
        ({"type": "push_to_talk"}, PARAM + ".type"),
    ],
)
async def test_a_setting_of_the_other_type_is_refused_by_param(
    server: RunningServer, detection: dict[str, Any], param: str
) -> None:
    _need_models()
    async with connect(server.ws_url) as client:
        await client.send("session.update", session={"turn_detection": detection})
        error = await client.error()
        assert (error["code"], error["param"]) == ("invalid_value", param)


@pytest.mark.real_speech
@pytest.mark.parametrize("absent", ["pipecat", "silero_vad", "onnxruntime", "transformers"])
async def test_semantic_vad_without_its_models_is_refused_by_param(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, absent: str
) -> None:
    monkeypatch.setitem(sys.modules, absent, None)  # as if not installed
    async with connect(server.ws_url) as client:
        await client.send(
            "session.update",
            session={"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
        )
        error = await client.error()
        assert error["param"] == PARAM + ".type"
        assert "semantic-vad" in error["message"]
        await client.send("session.update", session={})
        vad = _vad((await client.expect("session.updated"))["session"])
        assert vad["type"] == "server_vad"  # as it was


async def test_idle_timeout_null_turns_it_off(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.send("session.update", session={"turn_detection": {"idle_timeout_ms": 5000}})
        assert _vad((await client.expect("session.updated"))["session"])["idle_timeout_ms"] == 5000
        await client.send("session.update", session={"turn_detection": {"threshold": 0.6}})
        vad = _vad((await client.expect("session.updated"))["session"])
        assert (vad["idle_timeout_ms"], vad["threshold"]) == (5000, 0.6)  # left out: kept
        await client.send("session.update", session={"turn_detection": {"idle_timeout_ms": None}})
        vad = _vad((await client.expect("session.updated"))["session"])
        assert (vad["idle_timeout_ms"], vad["threshold"]) == (None, 0.6)


def _pcm(audio: torch.Tensor) -> bytes:
    return (audio.clamp(-1, 1) * 32767).round().to(torch.int16).numpy().tobytes()


@pytest.mark.real_speech
async def test_semantic_vad_ends_a_spoken_turn_and_the_openai_client_reads_it(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _need_models()
    need_espeak()
    # Smart Turn takes a tenth of a second or more: it must not hold the event loop.
    judged_on: list[threading.Thread] = []
    complete = turn_models.SmartTurn.complete

    def recorded(self: turn_models.SmartTurn, start: int, end: int) -> bool:
        judged_on.append(threading.current_thread())
        return complete(self, start, end)

    monkeypatch.setattr(turn_models.SmartTurn, "complete", recorded)
    sentence = say(SENTENCE, RATE)
    end_ms = 1000 + sentence.numel() * 1000 // RATE
    audio = _pcm(torch.cat([silence(1000, RATE), sentence, silence(2000, RATE)]))
    client = AsyncOpenAI(
        api_key="unused", websocket_base_url=server.ws_url.removesuffix("/realtime")
    )
    async with client.realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {
                        "turn_detection": {
                            "type": "semantic_vad",
                            "eagerness": "medium",
                            "create_response": False,
                        }
                    }
                },
            }
        )
        updated = await conn.recv()
        assert updated.type == "session.updated"
        detection = updated.session.audio.input.turn_detection  # type: ignore[union-attr]
        assert detection is not None
        assert detection.type == "semantic_vad"
        step = RATE // 50 * 2  # 20 ms pieces, as a microphone streams
        for i in range(0, len(audio), step):
            chunk = base64.b64encode(audio[i : i + step]).decode()
            await conn.input_audio_buffer.append(audio=chunk)
        started = stopped = None
        async with asyncio.timeout(DEADLINE_S):
            async for event in conn:
                if event.type == "input_audio_buffer.speech_started":
                    started = event.audio_start_ms
                elif event.type == "input_audio_buffer.speech_stopped":
                    stopped = event.audio_end_ms
                elif event.type == "input_audio_buffer.committed":
                    break
        assert started is not None
        assert 700 <= started <= 850
        assert judged_on
        assert threading.main_thread() not in judged_on
        pause = EAGERNESS["medium"].pause_ms
        assert stopped is not None
        assert end_ms + pause - 50 <= stopped <= end_ms + pause + 200
