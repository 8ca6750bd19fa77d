"""``turn_detection.idle_timeout_ms``: no speech for that long after a reply has played,
and the server commits the silence and replies (``input_audio_buffer.timeout_triggered``)."""

from __future__ import annotations

import torch
from realtime_client import RATE, connect, silence, speech

from omni_actors.server.runner import RunningServer
from omni_actors.server.session_config import VadSettings
from omni_actors.server.turns import Forward, Started, TimedOut, TurnDetector


def _pcm(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.int16)


def test_the_wait_starts_when_the_reply_has_played_and_speech_stops_it() -> None:
    turns = TurnDetector(VadSettings(idle_timeout_ms=1000), RATE)
    turns.feed(_pcm(silence(0.5)))
    turns.reply_ended(playback_ms=500)  # played until 1.0 s of input
    assert not any(isinstance(a, TimedOut) for a in turns.feed(_pcm(silence(1.4))))
    actions = turns.feed(_pcm(silence(0.2)))
    assert isinstance(actions[0], Forward)
    assert actions[0].samples.numel() > 0
    assert actions[-1] == TimedOut(audio_start_ms=1000, audio_end_ms=2100)
    # Once: no second timeout without another reply.
    assert not any(isinstance(a, TimedOut) for a in turns.feed(_pcm(silence(2.0))))
    # Speech after a reply stops the wait.
    turns.reply_ended(playback_ms=0)
    actions = turns.feed(_pcm(speech(0.5)))
    assert any(isinstance(a, Started) for a in actions)
    assert not any(isinstance(a, TimedOut) for a in turns.feed(_pcm(silence(3.0))))


def test_without_idle_timeout_silence_never_times_out() -> None:
    turns = TurnDetector(VadSettings(), RATE)
    turns.reply_ended(playback_ms=0)
    assert not any(isinstance(a, TimedOut) for a in turns.feed(_pcm(silence(10.0))))


async def test_a_quiet_user_is_prompted_after_the_idle_timeout(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.send(
            "session.update",
            session={
                "type": "realtime",
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 1000}}
                },
            },
        )
        updated = await client.expect("session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 1000
        await client.send(
            "conversation.item.create",
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        )
        await client.send("response.create")
        events = await client.until("response.done")
        played = sum(
            len(e["delta"]) * 3 // 4 // 2
            for e in events
            if e["type"] == "response.output_audio.delta"
        )
        played_ms = played * 1000 // RATE
        # Silence while the reply plays and 0.9 s after: no timeout yet (a clear's
        # answer comes next, with nothing before it).
        await client.say(silence(played_ms / 1000 + 0.9))
        await client.send("input_audio_buffer.clear")
        await client.expect("input_audio_buffer.cleared")
        await client.say(silence(0.2))
        triggered = await client.expect("input_audio_buffer.timeout_triggered")
        assert triggered["audio_start_ms"] == played_ms
        assert triggered["audio_end_ms"] - triggered["audio_start_ms"] >= 1000
        committed = await client.expect("input_audio_buffer.committed")
        assert committed["item_id"] == triggered["item_id"]
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "completed"


async def test_idle_timeout_must_be_positive(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        await client.send(
            "session.update",
            session={
                "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 0}}}
            },
        )
        error = await client.error()
        assert error["param"] == "session.audio.input.turn_detection.idle_timeout_ms"
