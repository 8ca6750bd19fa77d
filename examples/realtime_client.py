"""A realtime client with nothing but a websocket: the OpenAI Realtime GA events.

It speaks one turn (a WAV file, or a synthesized utterance), then is silent: the
server's voice activity detection ends the turn and answers it. The reply's transcript
is printed and its audio written to a WAV file.

Run: omni-actors serve --preset tiny-omni --api-key KEY
     python examples/realtime_client.py ws://127.0.0.1:8000/v1/realtime --api-key KEY
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import websockets
from caller import RATE, arguments, served_model, silence, utterance, write_wav

FRAME = RATE // 50 * 2  # 20 ms of PCM16, as a microphone sends it
REPLY_S = 60  # how long to wait for the reply


async def main() -> None:
    args = arguments(__doc__ or "")
    model = served_model(args.url, args.api_key)
    headers = {"Authorization": f"Bearer {args.api_key}"}
    async with websockets.connect(f"{args.url}?model={model}", additional_headers=headers) as ws:

        async def send(kind: str, **fields: Any) -> None:
            await ws.send(json.dumps({"type": kind, **fields}))

        assert json.loads(await ws.recv())["type"] == "session.created"
        vad = {"type": "server_vad", "silence_duration_ms": 500}
        session = {"type": "realtime", "audio": {"input": {"turn_detection": vad}}}
        await send("session.update", session=session)
        audio = utterance(args.wav) + silence(1.0)  # speech, then silence: the turn ends
        for i in range(0, len(audio), FRAME):
            chunk = base64.b64encode(audio[i : i + FRAME]).decode()
            await send("input_audio_buffer.append", audio=chunk)

        reply, transcript, status = bytearray(), "", "not received"
        try:
            async with asyncio.timeout(REPLY_S):
                async for message in ws:
                    event = json.loads(message)
                    match event["type"]:
                        case "error":
                            raise SystemExit(f"the server refused an event: {event['error']}")
                        case "response.output_audio.delta":
                            reply += base64.b64decode(event["delta"])
                        case "response.output_audio_transcript.delta":
                            transcript += event["delta"]
                        case "response.done":
                            status = event["response"]["status"]
                            break
        except TimeoutError:
            raise SystemExit(
                f"no reply within {REPLY_S} s: the server heard no turn end "
                "(with Silero VAD, give --wav a recording of speech)"
            ) from None
    write_wav(args.out, bytes(reply))
    print(f"reply {status}: {len(reply) / 2 / RATE:.2f} s of audio -> {args.out}")
    print(f"transcript: {transcript}")


if __name__ == "__main__":
    asyncio.run(main())
