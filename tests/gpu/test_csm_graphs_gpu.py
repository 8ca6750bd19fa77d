"""The synthesizer's frames replayed from CUDA graphs on tiny-cascade: every frame shape
and depth-decoder bucket captures (none left eager), a session alone gets the frames an
eager model on the same GPU gives it, bit for bit, and sessions run together in a padded
bucket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from omni_actors.actors.engines.cascade.tts_model import Speech, SpeechChunk, SpeechModel
from omni_actors.actors.engines.step_loop import StepLoop
from omni_actors.models.cache import prepare

DEVICE = torch.device("cuda", 0)
FRAMES = 6
TEXTS = ("Hello there,", "A longer phrase to speak,", "Hi")


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare("tiny-cascade", cache_dir=tmp_path_factory.mktemp("weights"), seed=0) / "tts"


async def _speak(model: SpeechModel, *, together: bool) -> list[torch.Tensor]:
    async def execute(chunks: list[SpeechChunk]) -> list[torch.Tensor | None]:
        return model.step(chunks)

    loop: StepLoop[Speech, torch.Tensor | None] = StepLoop(
        execute, slots=4, max_context=512, max_tokens_per_step=512, max_chunk=512, max_rows=4
    )

    async def speak(text: str) -> torch.Tensor:
        request = loop.open(text)
        work, frames = Speech(model.prompt(text, 0)), []
        for _ in range(FRAMES):
            frame = (await loop.submit(request, work, work.length, decode=work.length == 1))[-1]
            assert frame is not None
            frames.append(frame)
            work = Speech(frames=frame[None])
        return torch.stack(frames)

    loop.start()
    try:
        if together:
            return list(await asyncio.gather(*(speak(text) for text in TEXTS)))
        return [await speak(text) for text in TEXTS]
    finally:
        await loop.stop()


async def test_graphed_frames_capture_and_equal_eager_frames(path: Path) -> None:
    torch.cuda.set_device(DEVICE)
    graphed = SpeechModel(
        path, DEVICE, slots=4, max_context=512, max_rows=4, graphs=True, warm=True
    )
    assert graphed.graphed == graphed.frame_keys()
    assert graphed.depth_graphed == [1, 2, 4]
    eager = SpeechModel(path, DEVICE, slots=4, max_context=512, max_rows=4)
    alone = await _speak(graphed, together=False)
    for text, mine, expected in zip(TEXTS, alone, await _speak(eager, together=False), strict=True):
        assert torch.equal(mine, expected), text
    # Three rows a step run as the bucket of four: other kernel shapes than one row's,
    # whose sums may round otherwise, so these codes are not compared bit for bit.
    together = await _speak(graphed, together=True)
    assert [t.shape for t in together] == [(FRAMES, graphed.codebooks)] * len(TEXTS)
