"""``bench boundary``: what a code2wav chunk policy's ``left_context`` costs in audio.

A streamed edge cuts the talker's codec frames into windows (``ChunkPolicy``: a small
first chunk, then ``frames`` new frames behind ``left_context`` frames already decoded),
and code2wav decodes each window alone. Where the context covers the decoder's receptive
field, the streamed audio is the one-shot decode of the whole utterance; where it does
not (Qwen3-Omni's pre-transformer attends over a sliding window of 72 frames through 8
layers), the samples differ, most right after each boundary.

This runs the code2wav engine as a stage does, on the release ``model`` names: the same
random codec frames (seeded) decoded once as one window (a ``full`` edge) and once as the
policy cuts them, for each ``left_context`` asked. It reports the maximum and the RMS
sample error of the streamed audio against the one-shot audio, over the whole utterance
and within one frame (1920 samples) after each boundary, beside the one-shot audio's own
RMS for scale.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import torch

from omni_actors.actors.engines.contract import CONTEXT_FIELD, Fields
from omni_actors.actors.stage.chunk_policy import ChunkPolicy

__all__ = ["boundary_errors", "run_boundary_bench"]


def boundary_errors(
    streamed: torch.Tensor, one_shot: torch.Tensor, boundaries: Sequence[int], per_frame: int
) -> dict[str, float]:
    """Max and RMS of ``streamed - one_shot``: over all samples, and over the
    ``per_frame`` samples after each boundary (sample index)."""
    if streamed.shape != one_shot.shape:
        raise ValueError(f"streamed {tuple(streamed.shape)} != one-shot {tuple(one_shot.shape)}")
    error = (streamed.double() - one_shot.double()).abs()
    near = torch.zeros_like(error, dtype=torch.bool)
    for start in boundaries:
        near[start : start + per_frame] = True
    at = error[near] if bool(near.any()) else error[:0]

    def rms(values: torch.Tensor) -> float:
        return math.sqrt(float((values**2).mean())) if values.numel() else 0.0

    return {
        "max_error": float(error.max()) if error.numel() else 0.0,
        "rms_error": rms(error),
        "boundary_max_error": float(at.max()) if at.numel() else 0.0,
        "boundary_rms_error": rms(at),
        "signal_rms": rms(one_shot.double()),
    }


async def _decode(engine: Any, session: str, inputs: list[Fields]) -> torch.Tensor:
    async def feed() -> AsyncIterator[Fields]:
        for item in inputs:  # onto the engine's device, as its stage hands them over
            yield {
                k: v.to(engine.device) if isinstance(v, torch.Tensor) else v
                for k, v in item.items()
            }

    pieces = [out["audio"] async for out in engine.generate(session, feed())]
    await engine.release(session)
    return torch.cat([p.reshape(-1).float().cpu() for p in pieces])


def _windows(codes: torch.Tensor, policy: ChunkPolicy) -> tuple[list[Fields], list[int]]:
    """The inputs a stage hands code2wav for ``codes`` [frames, groups] under ``policy``,
    and the frame index where each chunk after the first starts."""
    window = policy.window()
    chunks = [c for frame in codes for c in window.push(frame[None])] + window.finish()
    inputs: list[Fields] = []
    starts: list[int] = []
    done = 0
    for chunk in chunks:
        fields: dict[str, torch.Tensor | str] = {"codes": chunk.frames}
        if chunk.context:
            fields[CONTEXT_FIELD] = torch.tensor(chunk.context)
        inputs.append(fields)
        if done:
            starts.append(done)
        done += chunk.frames.shape[0] - chunk.context
    return inputs, starts


async def run_boundary_bench(
    model: Path,
    *,
    left_contexts: Sequence[int],
    initial_frames: int = 4,
    frames: int = 25,
    utterance_frames: int = 200,
    device: str = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    """Decode ``utterance_frames`` random frames one-shot and streamed under each
    ``ChunkPolicy(initial_frames, frames, left_context)``; the errors per left context."""
    from omni_actors.actors.engines.qwen3_omni.code2wav_engine import (
        Code2WavArgs,
        Code2WavEngine,
    )

    engine = Code2WavEngine(Code2WavArgs(model=str(model), device=device))
    await engine.start()
    try:
        groups, codebook = engine.model.quantizers, engine.model.codebook
        per_frame = engine.model.per_frame
        generator = torch.Generator().manual_seed(seed)
        codes = torch.randint(0, codebook, (utterance_frames, groups), generator=generator)
        one_shot = await _decode(engine, "one-shot", [{"codes": codes}])
        results: dict[str, Any] = {}
        for context in left_contexts:
            inputs, starts = _windows(codes, ChunkPolicy(initial_frames, frames, context))
            streamed = await _decode(engine, f"left-{context}", inputs)
            errors = boundary_errors(streamed, one_shot, [s * per_frame for s in starts], per_frame)
            results[str(context)] = {"chunks": len(inputs), **errors}
    finally:
        await engine.stop()
    return {
        "model": str(model),
        "device": device,
        "utterance_frames": utterance_frames,
        "policy": {"initial_frames": initial_frames, "frames": frames},
        "left_context": results,
    }
