"""Where a one-shot request's time goes, stage by stage, at concurrency 1.

Runs a preset (replies fixed at 16 tokens, 2 codec frames per token, as ``bench
pipeline`` fixes them) on five seeded random prompts of each length given, one at a
time, and prints one JSON object per request: when the caller saw its first text and
first audio, and per stage when the engine yielded its first output (ms from the
request), the summed and longest wait of its input chunks, and its compute time. The
gap between the entry stage's first output and the caller's first text is the hop to
the caller; a stage's first output against its sender's is its own start-up.

    python3 benchmarks/ttft_timeline.py PRESET MODEL|- TOKENS [TOKENS ...]
    python3 benchmarks/ttft_timeline.py qwen3-omni-1gpu /tmp/q3 16 2500

``PROCESS=1`` runs every stage in a worker process of its own (``with_process_stages``).
``LOG_STEPS=1`` also logs every engine step to stderr (its rows, positions and time: the
step loops' debug lines, workers' included).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from omni_actors.bench.models import fixed_frames, fixed_replies
from omni_actors.bench.random_prompts import RandomPrompts, entry_vocabulary
from omni_actors.cli.prepare import prepared_spec
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import load_pipeline
from omni_actors.protocols.events import AudioDelta, Done, TextDelta
from omni_actors.protocols.stage import StageMetrics


def stage_row(metrics: StageMetrics, started: float) -> dict[str, Any]:
    first = metrics.first_output_at
    return {
        "first": None if first is None else round((first - started) * 1e3, 1),
        "qwait": round(metrics.queue_wait_ms, 1),
        "qmax": round(metrics.queue_wait_max_ms, 1),
        "compute": round(metrics.compute_ms, 1),
    }


async def main(preset: str, model: str | None, lengths: list[int]) -> None:
    spec = load_pipeline(preset)
    if model is not None:
        spec = spec.with_model(model)
    spec = fixed_frames(fixed_replies(prepared_spec(spec), 16), 2)
    if os.environ.get("PROCESS") == "1":
        spec = spec.with_process_stages()
    vocabulary = entry_vocabulary(spec)
    prompts = [(n, text) for n in lengths for text in RandomPrompts(vocabulary, n, 0).texts(5)]
    async with OmniPipeline(spec, max_sessions=1) as omni:
        for index, (tokens, text) in enumerate(prompts):
            started = time.time()
            seen: dict[str, float] = {}
            async for event in omni.generate(text=text):
                now = round((time.time() - started) * 1e3, 1)
                if isinstance(event, TextDelta):
                    seen.setdefault("text", now)
                elif isinstance(event, AudioDelta):
                    seen.setdefault("audio", now)
                elif isinstance(event, Done):
                    stages = {
                        name: stage_row(m, started) for name, m in event.metrics.stages.items()
                    }
                    ttft = event.metrics.ttft_ms
                    row = {
                        "n": index,
                        "tokens": tokens,
                        "client": seen,
                        "ttft": None if ttft is None else round(ttft, 1),
                        "stages": stages,
                    }
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    if os.environ.get("LOG_STEPS") == "1":
        logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)d %(message)s")
        logging.getLogger("omni_actors").setLevel(logging.DEBUG)  # workers take this level
    model = None if sys.argv[2] == "-" else sys.argv[2]
    asyncio.run(main(sys.argv[1], model, [int(n) for n in sys.argv[3:]]))
