"""Where a thinker step of first prompts goes, as the pipeline runs it.

Builds the thinker's model as its engine builds it from the qwen3-omni preset's
arguments (``thinker_engine.load_model``: the decode and prefill layers compiled, fresh
prefill graphs, ``max_sessions`` slots of ``max_context``), captures the fresh prefill
graphs of the shapes it times (K prompts of one length bucket), then for each
``--prompts`` K runs steps of K random prompts of ``--tokens`` positions, each from
the start of its own slot, through the engine's step loop (one step each, as a wave's
prompts share one), and prints one JSON line per K:

- ``step_ms``: the step's wall time (median of ``--steps``), host work included, and
  ``model_ms`` the mean of the model's call alone (what the step loop's trace times);
- ``busy_ms``: the device's kernel time in one profiled step, and ``kernels`` their count
  (``step_ms - busy_ms`` is what the device idled: host work, gaps between kernels);
- ``by_kind``: that kernel time by what the kernels do (:func:`kind`): the experts'
  grouped matmuls, attention, other matmuls, Triton kernels (inductor's fused glue, the
  experts' combine), copies and gathers, sorts, reductions, other elementwise kernels;
- ``top``: the kernels taking the most time (name, calls, ms);
- ``eager_steps``: steps that ran without a graph (nonzero: the shape went eager and
  ``step_ms`` is not a replay's).

Run from the repository root on a GPU machine, on a release that holds the thinker
(``THINKER_RELEASE=/dev/shm/q3-thinker`` after ``prepare-split``; see
``qwen3_omni_random_gpu.sh step-profile``)::

    python3 benchmarks/thinker_step_profile.py /dev/shm/q3-thinker --prompts 1 2 3

``--dry`` runs it on the CPU (a tiny-omni release then, no graphs: checks the script).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from omni_actors.actors.engines.qwen3_omni.sampling import Sampling
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, load_model
from omni_actors.actors.engines.qwen3_omni.thinker_model import (
    Fed,
    Feeding,
    Pick,
    ThinkerChunk,
    ThinkerModel,
)
from omni_actors.actors.engines.step_loop import StepLoop

KINDS = (
    "experts_mm",
    "attention",
    "matmul",
    "triton",
    "copy",
    "sort",
    "reduce",
    "elementwise",
    "other",
)
"""What :func:`kind` names a kernel, in the order the JSON lists them."""

# Lower-cased name fragments, checked in this order: the first kind with a match wins (a
# grouped matmul is a CUTLASS kernel too; inductor's Triton kernels name the ops they
# fused, copies and gathers among them).
_FRAGMENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("experts_mm", ("groupproblemshape", "grouped", "_grouped_mm", "ptrarray")),
    ("triton", ("triton",)),
    ("attention", ("flash", "fmha", "sdpa", "attention", "attn")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "splitk", "aten::mm")),
    ("sort", ("radix", "sort", "searchsorted", "topk", "cub::")),
    ("copy", ("copy", "cat", "index", "gather", "scatter", "memcpy", "memset", "fill")),
    ("reduce", ("reduce", "softmax", "norm", "mean", "sum")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
)


def kind(name: str) -> str:
    """What a kernel of this name does, one of :data:`KINDS`."""
    lowered = name.lower()
    for found, fragments in _FRAGMENTS:
        if any(fragment in lowered for fragment in fragments):
            return found
    return "other"


def summarize(kernels: Iterable[tuple[str, int, float]], steps: int, top: int) -> dict[str, Any]:
    """Kernels ``(name, calls, ms)`` of ``steps`` steps as per-step figures: ``busy_ms``,
    ``kernels`` (calls), ``by_kind`` (ms by :func:`kind`, every kind listed) and the
    ``top`` kernels ``[name, calls, ms]``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, calls, ms in kernels:
        totals[name][0] += calls
        totals[name][1] += ms
    by_kind = dict.fromkeys(KINDS, 0.0)
    for name, (_, ms) in totals.items():
        by_kind[kind(name)] += ms
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:top]
    return {
        "busy_ms": round(sum(ms for _, ms in totals.values()) / steps, 3),
        "kernels": round(sum(calls for calls, _ in totals.values()) / steps, 1),
        "by_kind": {name: round(ms / steps, 3) for name, ms in by_kind.items()},
        "top": [
            [name[:100], round(calls / steps, 1), round(ms / steps, 3)]
            for name, (calls, ms) in ranked
        ],
    }


def profiled_kernels(prof: Any, device: torch.device) -> list[tuple[str, int, float]]:
    """``(name, calls, ms)`` of each kernel the profile holds: device kernels on a GPU,
    operators' own CPU time on the CPU."""
    found = []
    for event in prof.key_averages():
        if device.type == "cuda":
            if event.device_type.name != "CUDA" or event.self_device_time_total <= 0:
                continue
            found.append((event.key, event.count, event.self_device_time_total / 1e3))
        elif event.self_cpu_time_total > 0:
            found.append((event.key, event.count, event.self_cpu_time_total / 1e3))
    return found


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bucketed(tokens: int, bucket: int) -> int:
    """The fresh prefill graph length a prompt of ``tokens`` positions replays."""
    return -(-tokens // bucket) * bucket


async def measure(
    model: ThinkerModel,
    args: ThinkerArgs,
    device: torch.device,
    prompts: Sequence[int],
    tokens: int,
    steps: int,
    top: int,
) -> None:
    vocab = int(model.text_config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    greedy = Pick(True, Sampling(1 << 30, 0, 0.0, None))

    async def execute(chunks: list[ThinkerChunk]) -> list[Fed]:
        return model.step(chunks)

    loop: StepLoop[Feeding, Fed] = StepLoop(
        execute,
        slots=args.max_sessions,
        max_context=args.max_context,
        max_tokens_per_step=args.max_tokens_per_step,
        max_chunk=args.max_prefill_chunk,
        max_rows=args.max_batch,
        whole_fresh_prefills=True,
        name="step profile",
    )
    loop.start()
    try:
        requests = [loop.open(f"s{i}") for i in range(max(prompts))]
        ids = [torch.randint(0, vocab, (tokens,), generator=generator).tolist() for _ in requests]
        for count in prompts:
            chosen = requests[:count]

            async def step(chosen: list[Any] = chosen) -> None:
                for request in chosen:
                    loop.rewind(request, 0)  # from the start of its slot again: fresh
                futures = [
                    loop.submit(request, Feeding(prompt, pick=greedy), tokens)
                    for request, prompt in zip(chosen, ids, strict=False)
                ]
                await asyncio.gather(*futures)

            before = loop.statistics().steps
            await step()  # the first: any lazy work (a capture, a compile) out of the times
            if loop.statistics().steps - before != 1:
                raise RuntimeError(f"{count} prompts did not share one step: raise the budget")
            model_s = loop.statistics().step_s
            times = []
            for _ in range(steps):
                sync(device)
                started = time.perf_counter()
                await step()
                sync(device)
                times.append((time.perf_counter() - started) * 1e3)
            model_ms = (loop.statistics().step_s - model_s) * 1e3 / steps
            activities = [ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            with profile(activities=activities) as prof:
                await step()
                sync(device)
            line = {
                "prompts": count,
                "tokens": tokens,
                "step_ms": round(statistics.median(times), 2),
                "step_ms_min": round(min(times), 2),
                "model_ms": round(model_ms, 2),
                **summarize(profiled_kernels(prof, device), 1, top),
                "eager_steps": model.eager_steps,
            }
            print(json.dumps(line), flush=True)
    finally:
        await loop.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", type=Path)
    parser.add_argument("--prompts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tokens", type=int, default=2508, help="a prompt's positions")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--max-sessions", type=int, default=32)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--dry", action="store_true", help="on the CPU")
    ns = parser.parse_args()
    device = torch.device("cpu" if ns.dry else "cuda:0")
    args = ThinkerArgs(
        model=str(ns.release),
        device=str(device),
        max_sessions=ns.max_sessions,
        max_context=ns.max_context,
    )
    started = time.perf_counter()
    model = load_model(ns.release, device, args, warm=False)
    length = bucketed(ns.tokens, args.prefill_bucket)
    graphed = model.warm_prefill_graphs([(count, length) for count in ns.prompts])
    print(
        json.dumps(
            {
                "what": "config",
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "torch": torch.__version__,
                "layers": int(model.text_config.num_hidden_layers),
                "compiled": model.compiled,
                "prefill_compiled": model.prefill_compiled,
                "graphed": [list(key) for key in graphed],
                "load_s": round(time.perf_counter() - started, 1),
            }
        ),
        flush=True,
    )
    with torch.no_grad():
        asyncio.run(measure(model, args, device, ns.prompts, ns.tokens, ns.steps, ns.top))


if __name__ == "__main__":
    main()
