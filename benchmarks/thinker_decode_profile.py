"""Where a thinker decode step's GPU time goes: the kernels of its graph replay, per
decode attention (gathered copy or read in place) and compile mode.

Runs ``bench decode`` on the thinker of a release (``--stage thinker=cuda:0``), and
profiles only its static (graph replay) steps; prints one JSON line per (attention,
compile): ms per step, GPU busy ms per step and the kernels taking the most time (name,
calls per step, ms per step). ``--dry`` runs on the CPU (a tiny-omni release then: checks
the script).

    python3 benchmarks/thinker_decode_profile.py /tmp/q3 --batch 32 --context 2600
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

from omni_actors.bench import decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", type=Path)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=2600)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--attention", nargs="+", default=["gather", "triton"])
    parser.add_argument("--compile", nargs="+", default=["default", "off"])
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--dry", action="store_true", help="on the CPU")
    args = parser.parse_args()
    activities = [ProfilerActivity.CPU] if args.dry else [ProfilerActivity.CUDA]
    timed = decode._timed_async
    for compile_mode in args.compile:
        for attention in args.attention:
            profiles: list[Any] = []

            async def profiled(
                step: Any,
                device: Any,
                steps: int,
                eager: Any,
                *rest: Any,
                profiles: list[Any] = profiles,
            ) -> float:
                if rest[0]:  # the eager steps: not profiled
                    return await timed(step, device, steps, eager, *rest)
                with profile(activities=activities) as prof:
                    ms = await timed(step, device, steps, eager, *rest)
                profiles.append(prof)
                return ms

            decode._timed_async = profiled  # type: ignore[assignment]
            try:
                report = decode.run_decode_bench(
                    args.release,
                    stages={"thinker": "cpu" if args.dry else "cuda:0"},
                    batches=[args.batch],
                    context=args.context,
                    steps=args.steps,
                    max_context=args.max_context,
                    thinker_compile={"default": None, "off": False, "on": True}[compile_mode],
                    decode_attention=attention,
                )
            finally:
                decode._timed_async = timed
            kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
            for event in profiles[0].key_averages():
                busy = event.device_time_total if not args.dry else event.cpu_time_total
                if busy <= 0 or (not args.dry and event.device_type.name != "CUDA"):
                    continue
                kernels[event.key][0] += event.count
                kernels[event.key][1] += busy / 1e3
            top = sorted(kernels.items(), key=lambda item: -item[1][1])[: args.top]
            thinker = report["thinker"]
            line = {
                "attention": attention,
                "compile": compile_mode,
                "compiled": thinker["compiled"],
                "in_place": thinker["in_place"],
                "batch": args.batch,
                "context": args.context,
                "step_ms": thinker["batches"][str(args.batch)]["static_ms"],
                "busy_ms_per_step": round(sum(v[1] for v in kernels.values()) / args.steps, 3),
                "top": [
                    [name[:90], round(calls / args.steps, 1), round(ms / args.steps, 3)]
                    for name, (calls, ms) in top
                ],
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
