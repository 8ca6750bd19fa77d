"""code2wav windows replayed from CUDA graphs give the eager forward's samples bit for bit,
per batch bucket, for a first chunk and a steady window; an engine on CUDA captures the
shapes it is told to warm at load and streams the audio its eager forward streams."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from omni_actors.actors.engines.contract import CONTEXT_FIELD, Fields
from omni_actors.actors.engines.qwen3_omni.code2wav_engine import (
    Code2WavArgs,
    Code2WavEngine,
    WindowShape,
)
from omni_actors.actors.engines.qwen3_omni.code2wav_model import Code2WavModel, Piece
from omni_actors.actors.engines.qwen3_omni.graphs import bucket, pad_rows
from omni_actors.actors.stage.chunk_policy import ChunkPolicy
from omni_actors.models.cache import prepare

DEVICE = torch.device("cuda", 0)
BUCKETS = (1, 2, 4)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-omni", cache_dir=root)
    return root


def random_codes(shape: tuple[int, ...], codebook: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, codebook, shape, generator=gen).to(DEVICE)


def same(pieces: list[Piece], expected: list[Piece]) -> bool:
    return len(pieces) == len(expected) and all(
        torch.equal(a, b)
        for got, want in zip(pieces, expected, strict=True)
        for a, b in zip(got, want, strict=True)
    )


def test_graphed_windows_equal_eager_windows_for_every_bucket(cache: Path) -> None:
    torch.cuda.set_device(DEVICE)
    model = Code2WavModel(cache / "tiny-omni" / "seed-0", DEVICE, buckets=BUCKETS)
    seed = 0
    for frames, context in ((4, 0), (50, 25)):  # a first chunk, a steady window
        start = model.start(context)
        for rows in (1, 3, 2, 4, 1, 3):
            seed += 1
            codes = random_codes((rows, model.quantizers, frames), model.codebook, seed)
            graphed = model.decode(codes, [start] * rows, common=True)
            size = bucket(rows, BUCKETS)
            assert size is not None
            # Eager on the same padded batch: the same kernels, so the same bits.
            eager = model.decode(pad_rows(codes, size), [start] * size)[:rows]
            assert same(graphed, eager), (frames, rows)
            assert all(p[0].device == DEVICE for p in graphed)
    skips = {4: 0, 50: 25 - 1 - model.reach_frames}
    expected = {(b, frames, skip) for frames, skip in skips.items() for b in (1, 2, 4)}
    assert set(model.graphed) == expected  # nothing fell back to eager
    assert model.eager_steps == 0
    # Each call's outputs are its own: a later replay leaves them as they were.
    codes = random_codes((1, model.quantizers, 50), model.codebook, 100)
    ((audio, held),) = model.decode(codes, [model.start(25)], common=True)
    kept = audio.clone()
    model.decode(torch.zeros_like(codes), [model.start(25)], common=True)
    assert torch.equal(audio, kept)
    assert held.shape[-1] == model.pending


async def stream(engine: Code2WavEngine, session: str, codes: torch.Tensor) -> list[Any]:
    """Decode ``codes`` [frames, Q] cut as the qwen3-omni edge cuts them (4, 25, 25)."""
    window = ChunkPolicy(4, 25, 25).window()
    chunks = [c for frame in codes for c in window.push(frame[None])] + window.finish()

    async def inputs() -> AsyncIterator[Fields]:
        for chunk in chunks:
            fields: dict[str, torch.Tensor | str] = {"codes": chunk.frames}
            if chunk.context:
                fields[CONTEXT_FIELD] = torch.tensor(chunk.context)
            yield fields

    return [out["audio"] async for out in engine.generate(session, inputs())]


async def test_an_engine_on_cuda_warms_its_windows_and_streams_the_eager_audio(
    cache: Path,
) -> None:
    warm = (
        WindowShape(frames=4),
        WindowShape(frames=29, left_context=4),
        WindowShape(frames=50, left_context=25),
    )
    graphed = Code2WavEngine(
        Code2WavArgs(cache_dir=cache, device="cuda:0", max_batch=4, warm_windows=warm)
    )
    eager = Code2WavEngine(Code2WavArgs(cache_dir=cache, device="cuda:0", cuda_graphs=False))
    await graphed.start()
    await eager.start()
    try:
        model = graphed.model
        skip = 25 - 1 - model.reach_frames
        shapes = {(4, 0), (29, 0), (50, skip)}  # 4 frames of context: nothing to skip
        assert set(model.graphed) == {(b, f, s) for f, s in shapes for b in BUCKETS}
        assert eager.model.graphed == []
        codes = random_codes((60, model.quantizers), model.codebook, 7)
        pieces = await stream(graphed, "a", codes)
        expected = await stream(eager, "a", codes)
        assert len(pieces) == len(expected) == 5  # 4, 25, 25, 6 new frames, the tail
        assert all(torch.equal(a, b) for a, b in zip(pieces, expected, strict=True))
        # The last chunk (31 frames) ran eager: no graph was captured for it.
        assert {key[1] for key in model.graphed} == {4, 29, 50}
    finally:
        await graphed.stop()
        await eager.stop()
