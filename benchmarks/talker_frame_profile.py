"""Where a talker frame's GPU time goes: the kernels of its graph replay, per batch size.

Loads the talker of a release (``RELEASE``, default ``/tmp/q3``) as ``bench decode`` does,
compiled as its engine compiles it on a GPU (``COMPILE=off``: the step as before;
``COMPILE=apart``: the code predictor's projections apart, not fused),
opens ``B`` sessions of 1024 positions, steps two frames (graph capture), then profiles
10 frames and prints one JSON line per batch size: kernels per frame, GPU busy ms per
frame, wall ms per frame (the step loop's whole frame, unprofiled), and the kernels that
take the most time (name, calls per frame, ms per frame). ``SDPA`` picks the attention
kernel PyTorch's scaled-dot-product attention may use (``default``: its own choice, cuDNN
on an H200; ``flash``, ``efficient`` or ``math``): the code predictor's 80 attentions a
frame over at most 16 positions each run cuDNN's kernel and a memset. Inductor's own
environment applies too (``TORCHINDUCTOR_MAX_AUTOTUNE=1``: its autotuned matmul templates).
``DECODE_FUSED_MIN_BLOCKS`` replaces the engines' threshold of the fused decode attention
(:data:`~omni_actors.actors.engines.qwen3_omni.static_decode.FUSED_MIN_BLOCKS`; 0: always
fused). ``DRY=1`` runs on the CPU (``RELEASE`` then a tiny-omni one: checks the script).

    python3 benchmarks/talker_frame_profile.py 1 32
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from omni_actors.actors.engines.qwen3_omni import static_decode
from omni_actors.actors.engines.qwen3_omni.frame_compile import FrameCompile
from omni_actors.actors.engines.qwen3_omni.talker_model import (
    Framed,
    TalkerChunk,
    TalkerFeed,
    TalkerModel,
)
from omni_actors.actors.engines.step_loop import StepLoop

FRAMES = 10


def main() -> None:
    dry = os.environ.get("DRY") == "1"
    device = torch.device("cpu" if dry else "cuda:0")
    release = Path(os.environ.get("RELEASE", "/tmp/q3"))
    batches = [int(b) for b in sys.argv[1:]] or [1, 32]
    backend = "aot_eager" if dry else "inductor"
    choice = os.environ.get("COMPILE", "all")
    compiled = None if choice == "off" else FrameCompile(backend, fused=choice != "apart")
    sdpa = os.environ.get("SDPA", "default")
    blocks = os.environ.get("DECODE_FUSED_MIN_BLOCKS")
    if blocks:
        static_decode.FUSED_MIN_BLOCKS = int(blocks)
    if sdpa != "default":
        kinds = ("flash", "efficient", "math", "cudnn")
        if sdpa not in kinds:
            raise SystemExit(f"SDPA is default or one of {', '.join(kinds)}, not {sdpa!r}")
        # Every kernel off but the one asked for: math stays as the fallback of last resort.
        torch.backends.cuda.enable_flash_sdp(sdpa == "flash")
        torch.backends.cuda.enable_mem_efficient_sdp(sdpa == "efficient")
        torch.backends.cuda.enable_cudnn_sdp(sdpa == "cudnn")
        torch.backends.cuda.enable_math_sdp(True)
    if not dry:
        torch.cuda.set_device(device)
    talker = TalkerModel(
        release,
        device,
        stop_at_codec_eos=False,
        slots=max(batches),
        max_context=2048,
        graphs=not dry,
        frame_compile=compiled,
    )
    width = int(talker.talker.config.thinker_hidden_size)
    dtype = next(talker.talker.parameters()).dtype
    speaker = next(iter(talker.speakers.values()))
    context = 64 if dry else 1024

    def rows(n: int) -> torch.Tensor:
        return torch.randn(n, width).to(device, dtype)

    async def execute(chunks: list[TalkerChunk]) -> list[Framed | None]:
        return talker.step(chunks)

    async def opened(batch: int) -> tuple[StepLoop[TalkerFeed, Framed | None], list[Any]]:
        loop: StepLoop[TalkerFeed, Framed | None] = StepLoop(
            execute, slots=batch, max_context=2048, max_tokens_per_step=4096, max_chunk=2048
        )
        loop.start()
        requests, carries = [loop.open(f"s{i}") for i in range(batch)], []
        for request in requests:
            mask = torch.zeros(context, dtype=torch.bool)
            inputs = talker.opening_inputs(rows(context), mask, rows(3), rows(3), rows(1), speaker)
            (*_, first) = await loop.submit(request, TalkerFeed(inputs, frame=True), len(inputs))
            assert first is not None
            assert first.frame is not None
            carries.append(first.frame[1])
        return loop, [requests, carries]

    async def frames(loop: StepLoop[TalkerFeed, Framed | None], state: list[Any]) -> None:
        requests, carries = state
        text = rows(1)
        futures = [
            loop.submit(r, TalkerFeed(carry=c, text=text, frame=True), 1, decode=True)
            for r, c in zip(requests, carries, strict=True)
        ]
        for index, future in enumerate(futures):
            (framed,) = await future
            assert framed is not None
            assert framed.frame is not None
            carries[index] = framed.frame[1]

    with torch.no_grad(), torch.device(device):
        for batch in batches:
            runner = asyncio.Runner()
            loop, state = runner.run(opened(batch))
            for _ in range(2):
                runner.run(frames(loop, state))
            if not dry:
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            for _ in range(FRAMES):
                runner.run(frames(loop, state))
            if not dry:
                torch.cuda.synchronize(device)
            wall = (time.perf_counter() - started) * 1e3 / FRAMES
            activities = [ProfilerActivity.CPU] if dry else [ProfilerActivity.CUDA]
            with profile(activities=activities) as prof:
                for _ in range(FRAMES):
                    runner.run(frames(loop, state))
                if not dry:
                    torch.cuda.synchronize(device)
            kernels: dict[str, list[float]] = defaultdict(list)
            for event in prof.events():
                on_device = event.device_type == torch.autograd.DeviceType.CUDA
                if on_device or (dry and event.cpu_parent is None):
                    kernels[event.name].append(event.device_time if on_device else 0.0)
            per_frame = sum(len(v) for v in kernels.values()) / FRAMES
            busy = sum(sum(v) for v in kernels.values()) / FRAMES / 1e3
            top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:25]
            print(
                json.dumps(
                    {
                        "batch": batch,
                        "compiled": talker.compiled,
                        "sdpa": sdpa,
                        "fused_min_blocks": static_decode.FUSED_MIN_BLOCKS,
                        "max_autotune": os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE") == "1",
                        "wall_ms_per_frame": round(wall, 3),
                        "kernels_per_frame": round(per_frame, 1),
                        "gpu_busy_ms_per_frame": round(busy, 3),
                        "top": [
                            [name[:90], round(len(v) / FRAMES, 1), round(sum(v) / FRAMES / 1e3, 3)]
                            for name, v in top
                        ],
                    }
                ),
                flush=True,
            )
            runner.run(loop.stop())
            runner.close()


if __name__ == "__main__":
    main()
