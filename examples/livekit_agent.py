"""A LiveKit agent's realtime model, served by omni-actors.

LiveKit's own ``openai.realtime.RealtimeModel``, unchanged, with ``base_url`` pointing
at ``omni-actors serve``: the model an ``AgentSession(llm=model)`` would run in a room.
Here no room (and no LiveKit server) is needed: the program opens the model's session
itself, pushes one turn of audio into it as the room's microphone track would (a WAV
file, or a synthesized utterance), and reads the reply the session generates once the
server's voice activity detection has ended the turn.

Run: pip install 'omni-actors[integrations]'
     omni-actors serve --preset tiny-omni --api-key KEY
     python examples/livekit_agent.py ws://127.0.0.1:8000/v1/realtime --api-key KEY
"""

from __future__ import annotations

import asyncio

import numpy as np
from caller import RATE, arguments, served_model, silence, utterance, write_wav
from livekit import rtc
from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel
from openai.types.realtime.realtime_audio_input_turn_detection import ServerVad

FRAME = RATE // 50  # 20 ms, as a room's audio track delivers it


async def main() -> None:
    args = arguments(__doc__ or "")
    model = RealtimeModel(
        base_url=args.url,
        api_key=args.api_key,
        model=served_model(args.url, args.api_key),  # LiveKit names gpt-realtime unless told
        # LiveKit's default, semantic_vad, needs the server's semantic-vad extra; server_vad
        # runs on every server. (Its default transcription model is taken where the pipeline has a
        # transcriber; tiny-omni's is tiny-whisper. Off here: not every pipeline has one.)
        turn_detection=ServerVad(type="server_vad"),
        input_audio_transcription=None,
    )
    session = model.session()
    replies: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
    session.on("generation_created", replies.put_nowait)
    session.on("error", lambda error: print(f"error: {error.error}"))
    try:
        samples = np.frombuffer(utterance(args.wav) + silence(1.0), dtype="<i2")
        for i in range(0, samples.size, FRAME):
            chunk = samples[i : i + FRAME]
            session.push_audio(rtc.AudioFrame(chunk.tobytes(), RATE, 1, chunk.size))

        generation = await asyncio.wait_for(replies.get(), timeout=120)
        audio, transcript = bytearray(), ""
        async for message in generation.message_stream:
            async for frame in message.audio_stream:
                audio += frame.data.tobytes()
            transcript += "".join([piece async for piece in message.text_stream])
    finally:
        await session.aclose()
        await model.aclose()
    write_wav(args.out, bytes(audio))
    print(f"reply: {len(audio) / 2 / RATE:.2f} s of audio -> {args.out}")
    print(f"transcript: {transcript}")


if __name__ == "__main__":
    asyncio.run(main())
