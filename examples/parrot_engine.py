"""An engine of your own behind the realtime server: a parrot.

``Parrot`` takes a user turn's audio, says how long it was, and plays it back. It is a
whole pipeline's model in one stage (``parrot.yaml``), so ``omni-actors serve`` serves it
to any realtime client — the official ``openai`` one, pipecat, LiveKit, or
``realtime_client.py`` here — as it serves a preset. Swap its ``generate`` for your own
model (an LLM and a TTS, a speech-to-speech model) and nothing else changes.

Run (from this directory, where the pipeline finds the engine by its import path):
     omni-actors serve --preset parrot.yaml --api-key KEY
     python realtime_client.py ws://127.0.0.1:8000/v1/realtime --api-key KEY
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import ClassVar

import torch

from omni_actors.actors.engines.contract import Fields

RATE = 16_000  # the pipeline hands an engine its input audio at inputs.sample_rate
CHUNK = RATE // 10  # 100 ms of audio per output, as a talker streams its frames


class Parrot:
    """Says how long the user spoke, then plays back what it heard."""

    inputs: ClassVar[dict[str, str]] = {"audio": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat", "audio": "concat"}
    audio_rate = RATE  # what it yields is at its input's rate: say so, or it plays too fast

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        heard: list[torch.Tensor] = []
        async for fields in inputs:  # the whole turn, up to the reply it asks for
            audio = fields.get("audio")
            if isinstance(audio, torch.Tensor):
                heard.append(audio)
        audio = torch.cat(heard) if heard else torch.zeros(0)
        for word in f"I heard {audio.numel() / RATE:.1f} seconds.".split():
            yield {"text": word + " "}
        for start in range(0, audio.numel(), CHUNK):
            await asyncio.sleep(0)  # a real model computes here; let the stage breathe
            yield {"audio": audio[start : start + CHUNK].contiguous()}
