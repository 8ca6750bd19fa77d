"""The official ``openai`` package's realtime client against the server: connect, update
the session, stream audio, answer, cancel — every event it receives parses as its own
GA models."""

from __future__ import annotations

import base64

from openai import AsyncOpenAI
from realtime_client import speech

from omni_actors.server.runner import RunningServer


async def test_the_openai_realtime_client_holds_a_conversation(server: RunningServer) -> None:
    client = AsyncOpenAI(
        api_key="unused", websocket_base_url=server.ws_url.removesuffix("/realtime")
    )
    async with client.realtime.connect(model="scripted-omni") as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        assert (await conn.recv()).type == "session.updated"
        await conn.input_audio_buffer.append(audio=base64.b64encode(speech(0.3)).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        audio = bytearray()
        transcript = ""
        types = []
        async for event in conn:
            types.append(event.type)
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            elif event.type == "response.output_audio_transcript.delta":
                transcript += event.delta
            elif event.type == "response.done":
                assert event.response.status == "completed"
                break
        assert types[:6] == [
            "input_audio_buffer.committed",
            "conversation.item.added",
            "conversation.item.done",
            "response.created",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert audio
        assert len(audio) % 2 == 0
        assert transcript

        # A second turn, cancelled after its first audio.
        await conn.input_audio_buffer.append(audio=base64.b64encode(speech(0.2)).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        async for event in conn:
            if event.type == "response.output_audio.delta":
                await conn.response.cancel()
            elif event.type == "response.done":
                assert event.response.status == "cancelled"
                assert event.response.status_details is not None
                assert event.response.status_details.reason == "client_cancelled"
                break
