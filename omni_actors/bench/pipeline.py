"""Pipeline benchmark: time to first audio of a scripted omni pipeline vs its ideal.

Scripted engines declare their compute time, so the latency a request would have if
every hop were free is known exactly (:mod:`omni_actors.bench.ideal`). What a request
measures beyond it is what the framework adds: admission and prewarm, messages between
stages, windowing, accounting. Dividing that by the hops on the path to the first audio
gives a per-hop cost that does not depend on the model's own latency. Scripted engines
sleep, and every sleep wakes a little late; the timer's overshoot is measured on the
same loop and reported, with the overhead net of it, so the two are not confused.

Two variants of the same thinker -> talker -> code2wav pipeline run: every edge
``stream`` (the talker starts on the thinker's first token, code2wav on the first
window of codec frames) and every edge ``full`` (each stage waits for its upstream to
finish), so the report also shows what streaming buys. Each variant runs at each
concurrency level with at most that many requests in flight.

Each pipeline runs in two placements: ``local`` (every stage an actor in the caller's
process, so a hop is a mailbox put) and ``process`` (every stage in a worker process,
so each hop also crosses the wire: encoding, a ZeroMQ socket, decoding). The difference
between the two, per hop, is what the wire costs a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import platform
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from omni_actors.actors.engines.scripted import ScriptedArgs, ScriptedEngine
from omni_actors.bench.engine_cpu import engine_cpu_ms_per_request
from omni_actors.bench.ideal import IdealTimes, ideal_times
from omni_actors.bench.pipeline_targets import targets, wire_ms_per_hop
from omni_actors.bench.profiling import Profiler
from omni_actors.bench.resources import tree_cpu_s
from omni_actors.bench.stats import percentile
from omni_actors.bench.steps import Progress, Steps
from omni_actors.models.heap import freeze_heap
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import DeadlinesSpec, PipelineSpec, load_pipeline
from omni_actors.protocols.control import EdgeMode
from omni_actors.protocols.events import Aborted, AudioDelta, AudioPacing, Done, SessionError

__all__ = [
    "DEFAULT_CONCURRENCY",
    "PLACEMENTS",
    "Placement",
    "bench_spec",
    "default_requests",
    "level_requests",
    "placed",
    "requests_parameter",
    "run_pipeline_bench",
]

Placement = Literal["local", "process"]
PLACEMENTS: tuple[Placement, ...] = get_args(Placement)

DEFAULT_CONCURRENCY = (1, 8, 64)
_WARMUP_REQUESTS = 3
_TIMER_SLEEPS = 60  # of 5 ms each: 0.3 s to calibrate the timer overshoot


def placed(spec: PipelineSpec, placement: Placement) -> PipelineSpec:
    """``spec`` with every stage in the caller's process (``local``) or each in a worker
    process (``process``), whatever the spec itself says, so the two runs differ only
    in the wire."""
    return spec.with_process_stages(placement == "process")


def default_requests(concurrency: int) -> int:
    """Requests per concurrency level when none is given: three waves, at least 20."""
    return max(3 * concurrency, 20)


def level_requests(
    concurrency: Sequence[int],
    requests: int | None,
    requests_per_level: int | None,
    default: Callable[[int], int],
) -> dict[int, int]:
    """Measured requests at each concurrency level ``c``: ``requests`` at every level, or
    ``requests_per_level`` x ``c`` (a closed loop of that many waves: vllm-omni's CI runs
    4 x c, 4 at c=1 and 128 at c=32), or else ``default(c)``.

    Raises:
        ValueError: both counts given, or either below 1.
    """
    if requests is not None and requests_per_level is not None:
        raise ValueError(
            f"requests ({requests}) and requests_per_level ({requests_per_level}) both "
            "set the requests of a level: give one"
        )
    for name, value in (("requests", requests), ("requests_per_level", requests_per_level)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if requests is not None:
        return {c: requests for c in concurrency}
    if requests_per_level is not None:
        return {c: requests_per_level * c for c in concurrency}
    return {c: default(c) for c in concurrency}


def requests_parameter(
    requests: int | None, requests_per_level: int | None, default: str
) -> int | str:
    """How a report's ``parameters`` name the requests of a level (see
    :func:`level_requests`): the count, ``K*c``, or ``default``."""
    if requests is not None:
        return requests
    return default if requests_per_level is None else f"{requests_per_level}*c"


def bench_spec(mode: EdgeMode) -> PipelineSpec:
    """The built-in bench pipeline: the ``scripted-omni`` preset with every edge in ``mode``.

    A ``full`` edge cannot window codec frames, so the ``full`` variant drops the chunk
    policy. Deadlines are generous: at high concurrency a slow request must be measured,
    not failed.
    """
    spec = load_pipeline("scripted-omni")
    if mode == "full":
        spec = spec.with_full_edges()
    deadlines = DeadlinesSpec(admission_s=60, first_chunk_s=60, inter_chunk_s=60, total_s=600)
    return spec.model_copy(update={"name": f"bench-{mode}", "deadlines": deadlines})


@dataclass(frozen=True, slots=True)
class _Sample:
    """One request's numbers: the session's own metrics, and the caller's TTFA."""

    ttfa_ms: float
    e2e_ms: float
    rtf: float
    client_ttfa_ms: float
    chunks: int = 0
    """Chunks its stages sent, each counted once per hop (to a stage or to the caller)."""
    ttft_ms: float | None = None
    audio_s: float = 0.0
    underruns: int = 0
    """Times a player 200 ms behind would have run dry (``SessionMetrics.pacing``)."""
    stall_ms: float = 0.0
    """The silence those underruns cost."""
    started_s: float = 0.0
    """When it was sent (``time.perf_counter()``), to place it among its level's."""


async def _request(omni: OmniPipeline, text: str = "hello") -> _Sample | str:
    """One ``generate`` of ``text``, read to its end; the sample, or why it failed."""
    started = time.perf_counter()
    client_ttfa_ms: float | None = None
    outcome: _Sample | str = "the stream ended without a terminal event"
    try:
        # Read to the end (no early return) so the generator closes its session here.
        async for event in omni.generate(text=text):
            if isinstance(event, AudioDelta) and client_ttfa_ms is None:
                client_ttfa_ms = (time.perf_counter() - started) * 1e3
            elif isinstance(event, Done):
                m = event.metrics
                if m.ttfa_ms is None or m.rtf is None or client_ttfa_ms is None:
                    outcome = "the request finished without audio"
                else:
                    chunks = sum(h.chunks for st in m.stages.values() for h in st.hops.values())
                    pacing = m.pacing or AudioPacing()
                    outcome = _Sample(
                        m.ttfa_ms,
                        m.e2e_ms,
                        m.rtf,
                        client_ttfa_ms,
                        chunks,
                        m.ttft_ms,
                        m.audio_s,
                        pacing.underruns,
                        pacing.stall_ms,
                        started,
                    )
            elif isinstance(event, SessionError):
                outcome = f"{event.code} at {event.stage or 'pipeline'}: {event.message}"
            elif isinstance(event, Aborted):
                outcome = f"aborted: {event.reason}"
    except Exception as exc:  # a library bug: count it, keep measuring the others
        outcome = f"generate raised {exc!r}"
    return outcome


async def _drive(
    omni: OmniPipeline, requests: int, concurrency: int, texts: Sequence[str] = ()
) -> list[_Sample | str]:
    """``requests`` requests, ``concurrency`` workers each taking the next one; request
    ``n`` sends ``texts[n]`` (``"hello"`` when there are none)."""
    tickets = itertools.count()
    results: list[_Sample | str] = []

    async def worker() -> None:
        while (n := next(tickets)) < requests:
            results.append(await _request(omni, texts[n] if texts else "hello"))

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, requests)):
            group.create_task(worker())
    return results


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def _timer_overshoot_ms() -> float:
    """How late a scripted engine's sleep wakes on this loop, on average, in ms.

    A scripted engine sleeps each latency from when it last woke, so this is paid once
    per sleep on a request's critical path; the ideal knows how many sleeps that is.
    """
    engine = ScriptedEngine(
        ScriptedArgs(
            first_output_s=0.005, per_output_s=0.005, outputs=_TIMER_SLEEPS, fields=("text",)
        )
    )

    async def one_input() -> AsyncIterator[dict[str, torch.Tensor | str]]:
        yield {"text": "calibrate"}

    started = time.perf_counter()
    async for _ in engine.generate("timer-calibration", one_input()):
        pass
    elapsed = time.perf_counter() - started
    return max(0.0, elapsed - _TIMER_SLEEPS * 0.005) / _TIMER_SLEEPS * 1e3


@dataclass(frozen=True, slots=True)
class _Cost:
    """What one level's measured requests cost: CPU of the process tree, and wall time;
    and what its engines cost by themselves per request (None: unknown)."""

    cpu_s: float
    wall_s: float
    engine_ms_per_request: float | None


def _level(
    results: list[_Sample | str], ideal: IdealTimes, overshoot_ms: float, cost: _Cost
) -> dict[str, Any]:
    """The report of one (variant, concurrency) run."""
    samples = [r for r in results if isinstance(r, _Sample)]
    errors = [r for r in results if isinstance(r, str)]
    ideal_ttfa_ms = ideal.ttfa_s * 1e3
    level: dict[str, Any] = {
        "requests": len(results),
        "errors": len(errors),
        "ideal_ttfa_ms": _ms(ideal_ttfa_ms),
        "ideal_e2e_ms": _ms(ideal.e2e_s * 1e3),
        "ideal_rtf": round(ideal.rtf, 4),
        "hops": ideal.hops,
        "ttfa_sleeps": ideal.ttfa_sleeps,
    }
    if samples:
        ttfa = [s.ttfa_ms for s in samples]
        p50 = percentile(ttfa, 50)
        level |= {
            "ttfa_ms_p50": _ms(p50),
            "ttfa_ms_p99": _ms(percentile(ttfa, 99)),
            "client_ttfa_ms_p50": _ms(percentile([s.client_ttfa_ms for s in samples], 50)),
            "e2e_ms_p50": _ms(percentile([s.e2e_ms for s in samples], 50)),
            "rtf_p50": round(percentile([s.rtf for s in samples], 50), 4),
            "overhead_ms_per_hop_p50": _ms((p50 - ideal_ttfa_ms) / ideal.hops),
            "overhead_ms_per_hop_net_of_timers_p50": _ms(
                (p50 - ideal_ttfa_ms - ideal.ttfa_sleeps * overshoot_ms) / ideal.hops
            ),
            "ttfa_vs_ideal": round(p50 / ideal_ttfa_ms, 4),
        }
    chunks = sum(s.chunks for s in samples)
    engine_ms = cost.engine_ms_per_request
    framework_s = None if engine_ms is None else cost.cpu_s - engine_ms * len(results) / 1e3
    level |= {
        # The tree's CPU less the engines' own (``engine_cpu``): caller, sessions,
        # stages and the wire.
        "framework_cpu_us_per_chunk_hop": (
            round(framework_s / chunks * 1e6, 2) if chunks and framework_s is not None else None
        ),
        "cpu_us_per_chunk_hop": round(cost.cpu_s / chunks * 1e6, 2) if chunks else None,
        "engine_cpu_ms_per_request": None if engine_ms is None else round(engine_ms, 3),
        "cpu_ms_per_request": round(cost.cpu_s / max(1, len(results)) * 1e3, 3),
        "cpu_cores": round(cost.cpu_s / cost.wall_s, 3) if cost.wall_s > 0 else None,
        "chunk_hops_per_request": round(chunks / len(samples), 1) if samples else None,
    }
    if errors:
        level["first_error"] = errors[0]
    return level


async def _run_variant(
    spec: PipelineSpec,
    ideal: IdealTimes,
    counts: dict[int, int],
    overshoot_ms: float,
    engine_ms: dict[int, float | None],
    profiler: Profiler | None,
    steps: Steps,
    label: str,
) -> dict[str, dict[str, Any]]:
    """Every concurrency level of one pipeline (``counts``: measured requests by level),
    each on a fresh, warmed-up pipeline (``engine_ms``: its engines' own CPU per request
    at each level), a step each."""
    levels: dict[str, dict[str, Any]] = {}
    for c, count in counts.items():
        steps.start(f"{label} c={c}")
        async with OmniPipeline(spec, max_sessions=c) as omni:
            await _drive(omni, _WARMUP_REQUESTS, min(c, _WARMUP_REQUESTS))
            # As a server does once ready (and each stage worker does): the heap loaded so
            # far is kept out of the collector's full collections.
            freeze_heap()
            cpu, wall = tree_cpu_s(), time.perf_counter()
            with profiler.section() if profiler is not None else contextlib.nullcontext():
                results = await _drive(omni, count, c)
            cost = _Cost(tree_cpu_s() - cpu, time.perf_counter() - wall, engine_ms[c])
            levels[str(c)] = _level(results, ideal, overshoot_ms, cost)
    return levels


async def _engine_cpu(spec: PipelineSpec, counts: dict[int, int]) -> dict[int, float | None]:
    """The engines' own CPU per request at each level (``engine_cpu``): as many requests
    as the level measures, at most two waves (eight at least), which is enough to
    average over and keeps ``c=1`` short."""
    return {
        c: await engine_cpu_ms_per_request(spec, c, min(count, max(2 * c, 8)))
        for c, count in counts.items()
    }


def _is_streaming(spec: PipelineSpec) -> bool:
    return all(edge.mode == "stream" for edge in spec.edges)


def _machine() -> dict[str, Any]:
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    return {
        "platform": platform.platform(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "cpus": os.cpu_count(),
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "loop": loop,
    }


def bench_specs(preset: str | Path | None) -> dict[str, PipelineSpec]:
    """The pipelines to measure by label: the built-in pair, or the one ``preset``."""
    if preset is None:
        return {"stream": bench_spec("stream"), "full": bench_spec("full")}
    spec = load_pipeline(preset)
    return {spec.name: spec}


async def _run_placement(
    specs: dict[str, PipelineSpec],
    ideals: dict[str, IdealTimes],
    placement: Placement,
    counts: dict[int, int],
    overshoot_ms: float,
    engine_ms: dict[str, dict[int, float | None]],
    builtin: bool,
    profiler: Profiler | None,
    steps: Steps,
) -> dict[str, Any]:
    """Every pipeline of ``specs`` in one placement: its variants and, for the built-in
    pair, the stream/full TTFA ratio per level."""
    variants = {
        name: await _run_variant(
            placed(spec, placement),
            ideals[name],
            counts,
            overshoot_ms,
            engine_ms[name],
            profiler,
            steps,
            f"{placement} {name}",
        )
        for name, spec in specs.items()
    }
    ratios: dict[str, float | None] = {}
    if "stream" in variants and "full" in variants and builtin:
        for c in map(str, counts):
            stream, full = variants["stream"][c], variants["full"][c]
            both = "ttfa_ms_p50" in stream and "ttfa_ms_p50" in full
            ratios[c] = round(stream["ttfa_ms_p50"] / full["ttfa_ms_p50"], 4) if both else None
    return {"variants": variants, "stream_vs_full_ttfa": ratios}


async def run_pipeline_bench(
    concurrency: list[int],
    requests: int | None,
    preset: str | Path | None,
    placements: Sequence[Placement] = ("local",),
    profiler: Profiler | None = None,
    progress: Progress | None = None,
    *,
    requests_per_level: int | None = None,
) -> dict[str, Any]:
    """Measure TTFA, E2E and RTF of scripted pipelines against their ideal.

    Must run inside an event loop (the CLI uses ``omni_actors.run``, i.e. uvloop when
    installed). The ideal of every pipeline is computed before anything runs, so a
    pipeline that has none fails at once.

    Args:
        concurrency: concurrency levels; at each, at most that many requests in flight.
        requests: measured requests per level (None: ``requests_per_level`` x c, or
            :func:`default_requests`), after a warm-up of a few.
        preset: a scripted preset name or YAML path to measure instead of the built-in
            stream and full pipelines.
        placements: where the stages run, each measured in turn: ``local`` (all in
            this process, the default) and/or ``process`` (each stage in a worker
            process), measured in the order given.
        profiler: profile the measured requests (not set-up or warm-up) of every
            level into it; the report then has ``profile``
            (:meth:`~omni_actors.bench.profiling.Profiler.report`).
        progress: told as each step starts (the calibration, then each placement,
            pipeline and level; see :mod:`~omni_actors.bench.steps`).
        requests_per_level: each level ``c`` measures this many times ``c`` requests
            (see :func:`level_requests`); not with ``requests``.

    Returns:
        A JSON-ready dict: ``placements`` (per placement: ``variants`` and
        ``stream_vs_full_ttfa``, below), ``wire_ms_per_hop`` (per pipeline and level,
        (process TTFA p50 - local TTFA p50) / hops; empty unless both ran), ``targets``
        (per placement: each goal, what was measured, ``met``),
        ``timer_overshoot_ms_per_sleep``, ``machine``, ``parameters`` and ``wall_s``.
        ``variants``: per pipeline, per concurrency level: TTFA p50
        and p99, the caller-side TTFA p50, E2E and RTF p50, the ideal TTFA/E2E/RTF,
        ``hops``, ``overhead_ms_per_hop_p50`` = (TTFA p50 - ideal) / hops, the same net
        of ``ttfa_sleeps`` timer overshoots, ``ttfa_vs_ideal``, ``errors``,
        ``requests``, and what the measured requests cost the process tree (this
        process and its workers): ``cpu_us_per_chunk_hop`` (CPU time divided by the
        chunks the stages sent, each counted once per hop),
        ``framework_cpu_us_per_chunk_hop`` (the same less the engines' own compute,
        ``engine_cpu_ms_per_request`` per request, measured by
        :mod:`~omni_actors.bench.engine_cpu`; None where it cannot be),
        ``cpu_ms_per_request``, ``cpu_cores`` (CPU / wall time) and
        ``chunk_hops_per_request``;
        ``stream_vs_full_ttfa``: per level, stream TTFA p50 / full TTFA p50 (built-in
        pipelines only).

    Raises:
        ValueError: a level, ``requests`` or ``requests_per_level`` below 1, both of
            those given, no or an unknown placement, or a
            pipeline whose ideal cannot be computed
            (:class:`~omni_actors.bench.ideal.IdealUnavailableError`).
    """
    if not concurrency or min(concurrency) < 1:
        raise ValueError(f"concurrency levels must be >= 1, got {concurrency}")
    counts = level_requests(concurrency, requests, requests_per_level, default_requests)
    if not placements or not set(placements) <= set(PLACEMENTS):
        raise ValueError(f"placements must be some of {list(PLACEMENTS)}, got {placements}")
    started = time.perf_counter()
    specs = bench_specs(preset)
    ideals = {name: ideal_times(spec) for name, spec in specs.items()}
    order = tuple(dict.fromkeys(placements))  # each once, in the order given
    steps = Steps(progress, 1 + len(order) * len(specs) * len(counts))
    steps.start("calibrating: timer overshoot, the engines' own CPU")
    overshoot_ms = await _timer_overshoot_ms()
    # Measured once, with no pipeline running: the engines cost the same in any placement.
    engine_ms = {name: await _engine_cpu(spec, counts) for name, spec in specs.items()}
    runs: dict[str, dict[str, Any]] = {
        placement: await _run_placement(
            specs,
            ideals,
            placement,
            counts,
            overshoot_ms,
            engine_ms,
            preset is None,
            profiler,
            steps,
        )
        for placement in order
    }
    streaming = next((name for name, spec in specs.items() if _is_streaming(spec)), None)
    report = {
        "placements": runs,
        "wire_ms_per_hop": wire_ms_per_hop(runs),
        "targets": {
            placement: targets(run["variants"], streaming) for placement, run in runs.items()
        },
        "timer_overshoot_ms_per_sleep": round(overshoot_ms, 4),
        "machine": _machine(),
        "parameters": {
            "concurrency": list(concurrency),
            "requests": requests_parameter(requests, requests_per_level, "max(3*c, 20)"),
            "requests_per_level": requests_per_level,
            "warmup_requests": _WARMUP_REQUESTS,
            "preset": None if preset is None else str(preset),
            "placements": list(runs),
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if profiler is not None:
        report["profile"] = profiler.report()
    return report
