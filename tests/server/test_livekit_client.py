"""LiveKit Agents' OpenAI ``RealtimeModel`` against the server, at its session level.

The model is LiveKit's own, unchanged: ``base_url`` points it at the server, ``model``
names the served one, and turn detection is set to ``server_vad`` (LiveKit's default is
``semantic_vad``, which the server refuses). Audio goes in through ``push_audio`` as an
``AgentSession`` pushes a room's microphone track, and each reply comes out as LiveKit's
``generation_created`` streams. The user speaks and is answered; speaks over the second
reply, which the server cancels (the client truncates it to what was heard, as
``AgentSession`` does) before answering the new turn; then asks for a reply with
``generate_reply`` and interrupts it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "livekit.plugins.openai.realtime",
    reason="needs the integrations extra: pip install omni-actors[integrations]",
)

from integration_clients import KEY, MODEL, REPLY_AUDIO_BYTES, SLOW
from livekit import rtc
from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel, RealtimeSession
from openai.types.realtime.realtime_audio_input_turn_detection import ServerVad
from realtime_client import RATE, silence, speech

from omni_actors.server.runner import run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing import eventually

WAIT_S = 30.0
FRAME = RATE // 50  # 20 ms, as a room's audio track delivers it


class Reply:
    """One generation, read as an ``AgentSession`` reads it: its message's audio frames
    and transcript."""

    def __init__(self, generation: llm.GenerationCreatedEvent) -> None:
        self.generation = generation
        self.message_id = ""
        self.samples = 0
        self.text = ""

    async def read(self) -> None:
        async for message in self.generation.message_stream:
            self.message_id = message.message_id
            async for frame in message.audio_stream:
                self.samples += frame.samples_per_channel
            self.text = "".join([piece async for piece in message.text_stream])


class Conversation:
    """A session and what it said: each reply, each ``response.done``, each error."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.replies: list[Reply] = []
        self.readers: list[asyncio.Task[None]] = []
        self.done: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.errors: list[llm.RealtimeModelError] = []
        self.speech_started = 0
        session.on("generation_created", self._generation)
        session.on("openai_server_event_received", self._event)
        session.on("input_speech_started", self._speech_started)
        session.on("error", self.errors.append)

    def _generation(self, generation: llm.GenerationCreatedEvent) -> None:
        reply = Reply(generation)
        self.replies.append(reply)
        self.readers.append(asyncio.create_task(reply.read()))

    def _event(self, event: dict[str, Any]) -> None:
        self.events.append(event["type"])
        if event["type"] == "response.done":
            self.done.append(event["response"])

    def _speech_started(self, _: llm.InputSpeechStartedEvent) -> None:
        self.speech_started += 1

    def push(self, pcm16: bytes) -> None:
        samples = np.frombuffer(pcm16, dtype="<i2")
        for i in range(0, samples.size, FRAME):
            chunk = samples[i : i + FRAME]
            self.session.push_audio(rtc.AudioFrame(chunk.tobytes(), RATE, 1, chunk.size))

    async def speak(self, seconds: float, seed: int) -> None:
        """Speech, then silence once the server has heard it start (see the pipecat
        test: a microphone's silence comes later still)."""
        heard = self.speech_started
        self.push(speech(seconds, seed=seed))
        await eventually(lambda: self.speech_started > heard, WAIT_S, "the server to hear speech")

    def statuses(self) -> list[tuple[str, str | None]]:
        return [(r["status"], (r.get("status_details") or {}).get("reason")) for r in self.done]

    async def close(self) -> None:
        await self.session.aclose()
        async with asyncio.timeout(WAIT_S):
            await asyncio.gather(*self.readers)


async def test_a_livekit_realtime_session_talks_with_the_server_and_is_interrupted() -> None:
    async with run_server(ServerSettings(port=0, api_key=KEY), pipeline=SLOW) as server:
        model = RealtimeModel(
            model=MODEL,
            base_url=server.url + "/v1",
            api_key=KEY,
            turn_detection=ServerVad(type="server_vad"),
            input_audio_transcription=None,  # LiveKit's default names a transcriber
        )
        talk = Conversation(model.session())
        try:
            # The user speaks; the server's VAD ends the turn and the reply comes back.
            await talk.speak(0.6, seed=0)
            talk.push(silence(1.0))
            await eventually(lambda: talk.statuses() == [("completed", None)], WAIT_S)
            await eventually(lambda: talk.replies[0].text, WAIT_S, "the first transcript")
            assert talk.replies[0].samples * 2 == REPLY_AUDIO_BYTES

            # A second turn; the user speaks over its first audio. The server cancels the
            # reply; the client cuts it to what was heard; the new turn is answered.
            await talk.speak(0.6, seed=1)
            talk.push(silence(1.0))
            await eventually(lambda: len(talk.replies) == 2 and talk.replies[1].samples, WAIT_S)
            await talk.speak(0.6, seed=2)
            barged = talk.replies[1]
            heard_ms = barged.samples * 1000 // RATE
            talk.session.truncate(
                message_id=barged.message_id, modalities=["audio"], audio_end_ms=heard_ms
            )
            talk.push(silence(1.0))
            await eventually(
                lambda: (
                    talk.statuses()
                    == [("completed", None), ("cancelled", "turn_detected"), ("completed", None)]
                ),
                WAIT_S,
                "the barged-in reply cancelled, then the new turn answered",
            )
            assert "conversation.item.truncated" in talk.events
            assert 0 < barged.samples * 2 < REPLY_AUDIO_BYTES
            await eventually(lambda: talk.replies[2].samples * 2 == REPLY_AUDIO_BYTES, WAIT_S)

            # A reply asked for by the app, interrupted on its first audio.
            generation = await asyncio.wait_for(talk.session.generate_reply(), WAIT_S)
            assert generation.user_initiated
            await eventually(lambda: talk.replies[3].samples, WAIT_S, "the asked reply's audio")
            talk.session.interrupt()
            await eventually(lambda: len(talk.done) == 4, WAIT_S, "the interrupted reply's end")
            assert talk.statuses()[3] == ("cancelled", "client_cancelled")
            assert talk.errors == []
        finally:
            await talk.close()
            await model.aclose()
