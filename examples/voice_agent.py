"""A voice agent's loop on a thinker -> talker -> code2wav pipeline.

The caller streams microphone audio into one conversation. At the end of each user turn
it asks for a response; the pipeline answers with text and audio while the session
keeps its state, and later turns pay no prewarm. On the third turn the user barges in:
the response is cancelled on every stage, the conversation is cut to what the user
heard (``truncate``), and a fourth turn is answered as usual.

Run: python examples/voice_agent.py [PRESET]   (default scripted-omni; tiny-omni runs the
real tiny models, preparing their weights first if needed)
"""

from __future__ import annotations

import sys

import torch

from omni_actors import AudioDelta, OmniPipeline, ResponseDone, TextDelta, run
from omni_actors.models.cache import prepare
from omni_actors.pipeline.spec.pipeline import load_pipeline

FRAME = 1600  # 100 ms of 16 kHz microphone audio


async def main(preset: str) -> int:
    spec = load_pipeline(preset)
    for family in spec.model_families().values():
        prepare(family)  # a no-op once the weights are in the cache
    rate = spec.outputs.sample_rate
    async with OmniPipeline(spec) as omni, omni.session() as session:
        for turn in range(1, 5):
            for _ in range(5):  # half a second of "speech", frame by frame
                await session.send(audio=torch.zeros(FRAME))
            response = await session.respond()
            text, samples = [], 0
            async for event in response.events():
                match event:
                    case TextDelta(text=piece):
                        text.append(piece)
                    case AudioDelta(audio=audio):
                        samples += audio.numel()
                        if turn == 3 and samples >= rate // 2:
                            await response.cancel()  # the user spoke again
                    case ResponseDone(status="completed", metrics=m):
                        print(
                            f"turn {turn}: {len(text)} text pieces, {samples / rate:.2f}s audio,"
                            f" TTFT {m.ttft_ms:.0f} ms, TTFA {m.ttfa_ms:.0f} ms, RTF {m.rtf:.2f}"
                        )
                    case ResponseDone(status=status):
                        heard_ms = 1000 * samples / rate
                        print(f"turn {turn}: {status} after {heard_ms:.0f} ms of audio")
                        await session.truncate(audio_ms=heard_ms)
                    case _:
                        print(f"turn {turn}: ended with {type(event).__name__}: {event}")
    print("pipeline closed cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(run(main(sys.argv[1] if len(sys.argv) > 1 else "scripted-omni")))
