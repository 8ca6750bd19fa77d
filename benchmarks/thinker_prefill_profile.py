"""Where a thinker prefill's time goes: the engine's step against transformers' forward.

Loads a release's thinker as its engine does (:class:`ThinkerModel`, slot cache, its
step loop) and times one prompt of each ``--tokens`` length prefilled through the loop
in one chunk, beside transformers' own text model on the same weights (``use_cache``
off, as ``../shared`` prefill probes ran it). Then one prefill of each under
``torch.profiler``: the top device kernels and host ops, and the number of host syncs
(``cudaStreamSynchronize``, ``cudaMemcpy`` device to host) per forward. Each is done
for every ``--moe`` variant in turn (the engine's ``moe`` argument: ``transformers``,
then ``lean`` swapped in on the same weights; ``compiled``: ``lean`` with the prefill
forwards' layers compiled as the engine's ``compile_prefill`` compiles them at load, its
compile time reported; every line names its ``moe``), with one
``experts`` line timing the first layer's experts forward alone under each. One JSON
object per line on stdout. Run from the repository root on a GPU machine:

    python3 benchmarks/thinker_prefill_profile.py /tmp/q3 --tokens 256 2500 \
        --moe lean compiled

``DRY=1`` runs it on the CPU (checks the script on tiny-omni's release path given).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from omni_actors.actors.engines.qwen3_omni.frame_compile import CompiledLayers, warm_prefill
from omni_actors.actors.engines.qwen3_omni.moe import install as moe_install
from omni_actors.actors.engines.qwen3_omni.sampling import Sampling
from omni_actors.actors.engines.qwen3_omni.thinker_model import (
    Fed,
    Feeding,
    Pick,
    ThinkerChunk,
    ThinkerModel,
)
from omni_actors.actors.engines.step_loop import StepLoop


def out(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Any, device: torch.device, n: int = 5) -> float:
    fn()
    fn()
    times = []
    for _ in range(n):
        sync(device)
        started = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 2)


def table(prof: Any, device: torch.device, rows: int = 18) -> list[dict[str, Any]]:
    cuda = device.type == "cuda"
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    return [
        {
            "name": e.key[:90],
            "calls": e.count,
            "self_ms": round(getattr(e, key) / 1e3, 3),
            "cpu_ms": round(e.self_cpu_time_total / 1e3, 3),
        }
        for e in events[:rows]
    ]


def host_syncs(prof: Any) -> dict[str, int]:
    names = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy")
    counts = {name: 0 for name in names}
    for event in prof.key_averages():
        if event.key in counts:
            counts[event.key] += event.count
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("release", type=Path)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 2500])
    parser.add_argument(
        "--moe",
        nargs="+",
        choices=["transformers", "lean", "compiled"],
        default=["transformers", "lean"],
    )
    ns = parser.parse_args()
    dry = os.environ.get("DRY") == "1"
    device = torch.device("cpu" if dry else "cuda:0")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    longest = max(ns.tokens)
    thinker = ThinkerModel(
        ns.release, device, slots=2, max_context=longest + 64, moe="transformers"
    )
    text = thinker._thinker.model
    config = thinker.text_config
    # The first MoE layer's block, to time its experts alone.
    block = next(m for m in text.modules() if hasattr(m, "experts") and hasattr(m, "gate"))
    out(
        what="config",
        layers=int(config.num_hidden_layers),
        experts=str(getattr(config, "_experts_implementation", None)),
        attention=str(getattr(config, "_attn_implementation", None)),
        gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        moe=ns.moe,
    )
    vocab = int(config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    greedy = Pick(True, Sampling(1 << 30, 0, 0.0, None))

    async def run() -> None:
        prompts = {
            tokens: torch.randint(0, vocab, (tokens,), generator=generator, device="cpu").tolist()
            for tokens in ns.tokens
        }
        for moe in ns.moe:
            if moe in ("lean", "compiled"):
                moe_install(text)  # a no-op once swapped
            if moe == "compiled":
                # The same weights, their prefill layers compiled as the engine's
                # ``compile_prefill`` compiles them at load (one model on the GPU, not two).
                started = time.perf_counter()
                backend = os.environ.get("COMPILE_BACKEND", "inductor")
                layers = CompiledLayers(text.layers, backend, "thinker prefill", prefill=True)
                warm_prefill(text, thinker.cache, thinker._configs, thinker.tts[:1], layers)
                thinker._prefill_layers = layers
                out(
                    what="compile",
                    moe=moe,
                    compile_s=round(time.perf_counter() - started, 1),
                    compiled=thinker.prefill_compiled,
                )
            model = thinker

            async def execute(chunks: list[ThinkerChunk], model: ThinkerModel = model) -> list[Fed]:
                return model.step(chunks)

            loop: StepLoop[Feeding, Fed] = StepLoop(
                execute,
                slots=2,
                max_context=longest + 64,
                max_tokens_per_step=longest,
                max_chunk=longest,
                name="prefill profile",
            )
            loop.start()
            request = loop.open("s")
            for tokens, ids in prompts.items():

                async def engine_prefill(
                    ids: list[int] = ids, loop: Any = loop, request: Any = request
                ) -> None:
                    request.computed = 0
                    await loop.submit(request, Feeding(ids, pick=greedy), len(ids))

                def hf_prefill(ids: list[int] = ids) -> None:
                    with torch.no_grad():
                        text(input_ids=torch.tensor([ids], device=device), use_cache=False)

                times = []
                for index in range(7):
                    sync(device)
                    started = time.perf_counter()
                    await engine_prefill()
                    sync(device)
                    if index >= 2:
                        times.append((time.perf_counter() - started) * 1e3)
                engine_ms = round(statistics.median(times), 2)
                hf_ms = timed(hf_prefill, device)
                out(
                    what="prefill",
                    moe=moe,
                    tokens=tokens,
                    engine_ms=engine_ms,
                    transformers_ms=hf_ms,
                )
                hidden = torch.randn(tokens, int(config.hidden_size), dtype=thinker.tts.dtype)
                _, weights, index = block.gate(hidden)
                experts_ms = timed(functools.partial(block.experts, hidden, index, weights), device)
                out(what="experts", moe=moe, tokens=tokens, layer_ms=experts_ms)
                activities = [ProfilerActivity.CPU]
                if device.type == "cuda":
                    activities.append(ProfilerActivity.CUDA)
                with profile(activities=activities) as prof:
                    await engine_prefill()
                    sync(device)
                out(
                    what="engine_profile",
                    moe=moe,
                    tokens=tokens,
                    syncs=host_syncs(prof),
                    top=table(prof, device),
                )
                with profile(activities=activities) as prof:
                    hf_prefill()
                    sync(device)
                out(
                    what="transformers_profile",
                    moe=moe,
                    tokens=tokens,
                    syncs=host_syncs(prof),
                    top=table(prof, device),
                )
            await loop.stop()

    with torch.no_grad(), torch.device(device):
        asyncio.run(run())


if __name__ == "__main__":
    main()
