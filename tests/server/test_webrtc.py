"""WebRTC calls (``POST /v1/realtime/calls``), from an aiortc caller as a browser calls.

The caller offers its microphone and the ``oai-events`` data channel; the server answers,
hears the microphone through its VAD, plays the reply on its track in real time, and
sends the session's events on the channel (no audio deltas: the audio is on the track).
A barge-in or ``response.cancel`` cuts the reply where the caller stopped hearing it.
The pipeline is scripted-omni with a tone for audio (``webrtc_engines``): each text
output ``t{k} `` is two 80 ms codec frames of it.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest_asyncio
from webrtc_client import call, speech
from webrtc_engines import tone_pipeline

from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing.waiting import eventually

KEY = "sk-webrtc-test"
MS_PER_OUTPUT = 160  # one text output: two 80 ms codec frames


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
        # The whole reply (5.12 s) plays on the track, at real time.
        await eventually(lambda: caller.heard_ms > 4500, timeout=20, what="the reply heard")
