"""Where a talker frame's GPU time goes: the kernels of its graph replay, per batch size.

Loads the talker of a release (``RELEASE``, default ``/tmp/q3``) as ``bench decode`` does,
compiled as its engine compiles it on a GPU (``COMPILE=off``: the step as before;
``COMPILE=fused``: the code predictor's projections fused too),
opens ``B`` sessions of 1024 positions, steps two frames (leases, capture), then profiles
10 frames and prints one JSON line per batch size: kernels per frame, GPU busy ms per
frame, and the kernels that take the most time (name, calls per frame, ms per frame).
``DRY=1`` runs on the CPU (``RELEASE`` then a tiny-omni one: checks the script).

    python3 benchmarks/talker_frame_profile.py 1 32
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from omni_actors.actors.engines.qwen3_omni.frame_compile import FrameCompile
from omni_actors.actors.engines.qwen3_omni.hf import DynamicCache
from omni_actors.actors.engines.qwen3_omni.static_decode import StaticPlan
from omni_actors.actors.engines.qwen3_omni.talker_model import FrameStep, TalkerModel, Voice

FRAMES = 10


def main() -> None:
    dry = os.environ.get("DRY") == "1"
    device = torch.device("cpu" if dry else "cuda:0")
    release = Path(os.environ.get("RELEASE", "/tmp/q3"))
    batches = [int(b) for b in sys.argv[1:]] or [1, 32]
    backend = "aot_eager" if dry else "inductor"
    choice = os.environ.get("COMPILE", "all")
    compiled = None if choice == "off" else FrameCompile(backend, fused=choice == "fused")
    plan = StaticPlan(max(batches), 2048, graphs=not dry)
    if not dry:
        torch.cuda.set_device(device)
    talker = TalkerModel(
        release, device, stop_at_codec_eos=False, static=plan, frame_compile=compiled
    )
    width = int(talker.talker.config.thinker_hidden_size)
    dtype = next(talker.talker.parameters()).dtype
    speaker = next(iter(talker.speakers.values()))
    context = 64 if dry else 1024

    def rows(n: int) -> torch.Tensor:
        return torch.randn(n, width).to(device, dtype)

    with torch.no_grad(), torch.device(device):
        for batch in batches:
            steps = []
            for _ in range(batch):
                voice = Voice(DynamicCache(config=talker.text_config))
                mask = torch.zeros(context, dtype=torch.bool)
                speech, frame = talker.open(
                    voice, rows(context), mask, rows(3), rows(3), rows(1), speaker
                )
                assert frame is not None
                steps.append(FrameStep(speech, frame[1], rows(1)))
            for _ in range(2):
                talker.frames(steps)
            activities = [ProfilerActivity.CPU] if dry else [ProfilerActivity.CUDA]
            with profile(activities=activities) as prof:
                for _ in range(FRAMES):
                    talker.frames(steps)
                if not dry:
                    torch.cuda.synchronize(device)
            kernels: dict[str, list[float]] = defaultdict(list)
            for event in prof.events():
                on_device = event.device_type == torch.autograd.DeviceType.CUDA
                if on_device or (dry and event.cpu_parent is None):
                    kernels[event.name].append(event.device_time if on_device else 0.0)
            per_frame = sum(len(v) for v in kernels.values()) / FRAMES
            busy = sum(sum(v) for v in kernels.values()) / FRAMES / 1e3
            top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:15]
            print(
                json.dumps(
                    {
                        "batch": batch,
                        "compiled": talker.compiled,
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


if __name__ == "__main__":
    main()
