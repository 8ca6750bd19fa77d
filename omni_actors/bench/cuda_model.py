"""``bench cuda``'s model figures: tiny-omni's TTFA on a GPU with async vs sync copies,
and the talker's code predictor per frame, eager vs replayed from one CUDA graph."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import torch

from omni_actors.bench.stats import percentile

if TYPE_CHECKING:
    from omni_actors.bench.cuda import CudaBenchConfig

__all__ = ["code_predictor_bench", "tiny_omni_bench"]

_PREDICTOR_DEADLINE_S = 300.0


_TINY_WARMUP = 2
_TINY_REPLY_TOKENS = 16  # TTFA does not depend on the reply's length; the run's time does
_TINY_DEADLINE_S = 300.0  # every request of both variants, warm-ups included
_PREDICTOR_FRAMES = 200


async def tiny_omni_bench(config: CudaBenchConfig) -> dict[str, Any]:
    """tiny-omni's TTFA p50 at concurrency 1 on ``config.device``, three ways: ``async``
    (the preset placed on the device: device links between its GPU stages, async
    staging), ``async_host`` (every edge on the host path, async staging) and ``sync``
    (the host path with ``.cpu()``/``.to()`` copies: the baseline).

    The pipelines run at once and take turns, one request at a time, so a drift of the
    machine (clocks, another tenant) weighs on all alike.
    """
    from omni_actors.bench.models import fixed_replies
    from omni_actors.bench.pipeline import _drive, _Sample
    from omni_actors.models.cache import prepare
    from omni_actors.pipeline.omni_pipeline import OmniPipeline
    from omni_actors.pipeline.spec.pipeline import load_pipeline

    spec = load_pipeline("tiny-omni").on_device(config.device)
    for family in spec.model_families().values():
        await asyncio.to_thread(prepare, family, cache_dir=config.cache_dir, seed=config.seed)
    spec = spec.with_weights(cache_dir=config.cache_dir, seed=config.seed)
    spec = fixed_replies(spec, _TINY_REPLY_TOKENS)
    sync = tuple(
        stage.model_copy(update={"staging": stage.staging.model_copy(update={"copies": "sync"})})
        for stage in spec.stages
    )
    host = tuple(edge.model_copy(update={"path": "host"}) for edge in spec.edges)
    variants = {
        "async": spec,  # device links between GPU stages, async staging to the caller
        "async_host": spec.model_copy(update={"edges": host}),
        "sync": spec.model_copy(update={"stages": sync, "edges": host}),
    }
    results: dict[str, list[_Sample | str]] = {label: [] for label in variants}
    async with contextlib.AsyncExitStack() as stack:
        omni = {
            label: await stack.enter_async_context(OmniPipeline(variant, max_sessions=1))
            for label, variant in variants.items()
        }
        async with asyncio.timeout(_TINY_DEADLINE_S):
            for pipeline in omni.values():
                await _drive(pipeline, _TINY_WARMUP, 1)
            for i in range(config.requests):
                turn = i % len(omni)
                for label in list(omni)[turn:] + list(omni)[:turn]:
                    results[label] += await _drive(omni[label], 1, 1)
    report: dict[str, Any] = {"requests": config.requests, "warmup_requests": _TINY_WARMUP}
    for label, got in results.items():
        ttfa = [r.ttfa_ms for r in got if isinstance(r, _Sample)]
        errors = [r for r in got if isinstance(r, str)]
        report[label] = {
            "ttfa_ms_p50": round(percentile(ttfa, 50), 4) if ttfa else None,
            "errors": len(errors),
        }
        if errors:
            report[label]["first_error"] = errors[0]
    a, s = report["async"]["ttfa_ms_p50"], report["sync"]["ttfa_ms_p50"]
    report["async_vs_sync_ttfa"] = None if a is None or s is None else round(a / s, 4)
    h = report["async_host"]["ttfa_ms_p50"]
    report["async_host_vs_sync_ttfa"] = None if h is None or s is None else round(h / s, 4)
    return report


def _frame_times(frame: Any, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """ms per call of ``frame(hidden, code0)``, each until the device is done with it."""
    times = []
    for hidden, code0 in inputs:
        start = time.perf_counter()
        frame(hidden, code0)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _code_predictor(config: CudaBenchConfig) -> dict[str, Any]:
    """The talker's code predictor per frame, eager vs replayed from a CUDA graph.

    The whole frame (prefill of ``[talker hidden, embed(code0)]``, then one forward per
    remaining codebook, greedy picks, the frame's embedding sum) is captured as one graph:
    its shapes are fixed and nothing in it reads the device from the host. Its fresh
    ``DynamicCache`` is allocated in the graph's memory pool, so replays reuse it.
    Runs in a thread of its own; the event loop is not blocked.
    """
    from omni_actors.actors.engines.qwen3_omni import configs, stepping, weights
    from omni_actors.models.cache import prepare

    device = torch.device(config.device)
    torch.cuda.set_device(device)
    path = prepare("tiny-omni", cache_dir=config.cache_dir, seed=config.seed)
    talker: Any = weights.load(path, "talker", device=device)
    width = int(talker.config.text_config.hidden_size)
    gen = torch.Generator(device=device).manual_seed(config.seed)
    inputs = [
        (
            torch.randn(1, 1, width, device=device, generator=gen),
            torch.randint(0, configs.CODEBOOK_SIZE, (1, 1), device=device, generator=gen),
        )
        for _ in range(_PREDICTOR_FRAMES)
    ]

    def eager(hidden: torch.Tensor, code0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return stepping.code_predictor_frame(talker, hidden, code0)

    _frame_times(eager, inputs[:10])  # warm-up: kernels chosen, allocator primed
    report: dict[str, Any] = {
        "forwards_per_frame": int(talker.config.num_code_groups) - 1,
        "frames": len(inputs),
        "eager_frame_ms_p50": round(percentile(_frame_times(eager, inputs), 50), 4),
    }
    static_hidden, static_code0 = (t.clone() for t in inputs[0])
    try:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
            for _ in range(3):
                eager(static_hidden, static_code0)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_codes, static_carry = eager(static_hidden, static_code0)
    except Exception as exc:  # capture is refused by some op: say which, time nothing
        return report | {"graph_frame_ms_p50": None, "graph": f"not measured: {exc!r}"}

    def replay(hidden: torch.Tensor, code0: torch.Tensor) -> None:
        static_hidden.copy_(hidden)
        static_code0.copy_(code0)
        graph.replay()

    exact = True
    for hidden, code0 in inputs[:20]:  # the same inputs through both: bit for bit
        codes, carry = eager(hidden, code0)
        replay(hidden, code0)
        exact &= bool(torch.equal(codes, static_codes) and torch.equal(carry, static_carry))
    graph_ms = round(percentile(_frame_times(replay, inputs), 50), 4)
    return report | {
        "graph_frame_ms_p50": graph_ms,
        "graph": "whole frame captured",
        "speedup": round(report["eager_frame_ms_p50"] / graph_ms, 2),
        "exact": exact,
    }


async def code_predictor_bench(config: CudaBenchConfig) -> dict[str, Any]:
    if torch.device(config.device).type != "cuda":
        return {"skipped": "needs CUDA"}
    async with asyncio.timeout(_PREDICTOR_DEADLINE_S):
        return await asyncio.to_thread(_code_predictor, config)
