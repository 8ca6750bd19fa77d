"""Benchmark of a model pipeline (``bench pipeline --preset tiny-omni``, ``--preset
qwen3-omni --model DIR``): what a user of the model waits for and what it costs, per
concurrency level, and streaming edges against full-payload edges.

A model pipeline has no ideal latency to compare with. Each level is measured on a fresh,
warmed-up pipeline with at most that many requests in flight, the way serving benchmarks
(vLLM's, vllm-omni's) measure a model: the time to the first text token and to the first
audio packet, the audio's real-time factor per request (the time from the request to
its last audio over the audio's length, vllm-omni's definition), each as a mean and a
p50, the underruns a player 200 ms behind each reply would have heard, text tokens per
second over the level, how busy each stage's engine was (its model calls over the
level's wall time: on a GPU, how busy the device was) and the host CPU the process tree
spent per second of audio it made. A level runs a set number of requests, or K x c of
them (a closed loop of K waves, as vllm-omni's CI runs 4 x c).

Prompts can be random text of an exact length in tokens
(:mod:`~omni_actors.bench.random_prompts`) and replies of an exact length, end of text
and codec EOS ignored, as vllm-omni's random-prompt runs are; for the ``qwen3-omni``
preset the report puts vllm-omni's published figures beside its own
(:data:`~omni_actors.bench.pipeline_targets.VLLM_OMNI_2XH100`).

By default the same weights also run with every edge ``full``: how much sooner streaming
delivers the first audio than waiting for each stage to finish (vllm-omni's published
async-chunk gain is 6459 -> 523 ms). Then the streaming pipeline is fed paced audio of
each input length (:mod:`omni_actors.bench.input_length`): the time to first audio after
the end of the input should not grow with its length.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from omni_actors.bench.input_length import (
    DEFAULT_INPUT_AUDIO_S,
    TTFA_RATIO_LIMIT,
    check_input_lengths,
    input_steps,
    measure_input_length,
)
from omni_actors.bench.pipeline import (
    _drive,
    _machine,
    _ms,
    _Sample,
    level_requests,
    requests_parameter,
)
from omni_actors.bench.pipeline_targets import VLLM_OMNI_2XH100, qwen3_omni_targets
from omni_actors.bench.random_prompts import PromptLengthError, RandomPrompts, entry_vocabulary
from omni_actors.bench.resources import tree_cpu_s
from omni_actors.bench.stats import percentile
from omni_actors.bench.steps import Progress, Steps
from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineConfigError, PipelineSpec, load_pipeline
from omni_actors.protocols.control import LinkCounts, StepCounts

__all__ = [
    "MODEL_CONCURRENCY",
    "default_requests",
    "fixed_frames",
    "fixed_replies",
    "full_variant",
    "is_model_pipeline",
    "model_table",
    "run_model_bench",
]

MODEL_CONCURRENCY = [1, 4, 16]
_WARMUP = 2
_HEALTH_TIMEOUT_S = 30.0  # asked with no request in flight, but a GPU stage may be slow
_TTFA_RATIO_LIMIT = 0.35  # streaming TTFA / full TTFA at concurrency 1
_RTF_LIMIT = 1.0  # at concurrency 4
# At concurrency 16 on a 2-core CPU: half of tiny-omni's 1.28 before sessions were batched.
_RTF_C16_LIMIT = 0.64


def default_requests(concurrency: int) -> int:
    """Measured requests per concurrency level when none are given: two waves, at least 8."""
    return max(2 * concurrency, 8)


def is_model_pipeline(spec: PipelineSpec) -> bool:
    """True if any stage runs a real model (its ideal latency cannot be computed)."""
    return any(stage.engine.kind != "scripted" for stage in spec.stages)


def full_variant(spec: PipelineSpec) -> PipelineSpec:
    """The same pipeline with every edge ``full`` (the non-streaming baseline).

    A preset ``<name>-full`` is used when it ships; otherwise the edges are turned to
    ``full`` here (chunk policies dropped: a full edge carries one payload).
    """
    try:
        return load_pipeline(f"{spec.name}-full")
    except PipelineConfigError:  # no such preset: derive it
        return spec.with_full_edges()


def fixed_replies(spec: PipelineSpec, tokens: int) -> PipelineSpec:
    """``spec`` with every text stage replying exactly ``tokens`` tokens.

    Random weights end a reply at a random token, so reply lengths, and with them the
    full-edge variant's latency, would follow the prompt by chance. A stage whose
    engine takes ``max_new_tokens`` gets it as both its minimum and maximum.
    """
    stages = tuple(
        stage.model_copy(
            update={
                "engine": stage.engine.model_copy(
                    update={
                        "args": {
                            **stage.engine.args,
                            "max_new_tokens": tokens,
                            "min_new_tokens": tokens,
                        }
                    }
                )
            }
        )
        if "max_new_tokens" in stage.engine.args
        else stage
        for stage in spec.stages
    )
    return spec.model_copy(update={"stages": stages})


def fixed_frames(spec: PipelineSpec, frames_per_token: int) -> PipelineSpec:
    """``spec`` with every talker making exactly ``frames_per_token`` codec frames per
    text token, codec EOS ignored: a stage whose engine takes ``frames_per_token`` and
    ``stop_at_codec_eos`` gets the first, and the second off.

    Random weights end speech at a random frame, or only at the talker's ``max_frames``;
    a set length makes the audio of every reply the same, as ``fixed_replies`` makes
    its text.

    Raises:
        PipelineConfigError: no stage's engine takes both arguments.
    """
    from omni_actors.actors.engines.registry import engine_type

    data = spec.model_dump(by_alias=True)
    fixed = 0
    for stage in data["stages"]:
        fields = engine_type(stage["engine"]["kind"]).args_model.model_fields
        if "frames_per_token" in fields and "stop_at_codec_eos" in fields:
            stage["engine"]["args"] = {
                **stage["engine"]["args"],
                "frames_per_token": frames_per_token,
                "stop_at_codec_eos": False,
            }
            fixed += 1
    if not fixed:
        raise PipelineConfigError(
            f"pipeline {spec.name}: no stage's engine takes frames_per_token (a talker)"
        )
    return PipelineSpec.model_validate(data)


@dataclass(frozen=True, slots=True)
class _Cost:
    """What one level's measured requests took: wall time, CPU of the process tree,
    each stage actor's engine busy seconds and the steps its engine ran eager although
    it has CUDA graphs (None: its engine does not tell or has no graphs, or a restart
    reset its count)."""

    wall_s: float
    cpu_s: float
    busy_s: dict[str, float | None]
    eager_steps: dict[str, int | None] = field(default_factory=dict)
    steps: dict[str, StepCounts | None] = field(default_factory=dict)
    links: dict[str, LinkCounts | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Counts:
    """One reading of every stage actor's engine counters (``OmniPipeline.health()``)."""

    busy_s: dict[str, float | None]
    eager_steps: dict[str, int | None]
    steps: dict[str, StepCounts | None] = field(default_factory=dict)
    links: dict[str, LinkCounts | None] = field(default_factory=dict)


async def _counts(omni: OmniPipeline) -> _Counts:
    health = await omni.health(timeout=_HEALTH_TIMEOUT_S)
    return _Counts(
        busy_s={name: stage.busy_s for name, stage in health.stages.items()},
        eager_steps={name: stage.eager_steps for name, stage in health.stages.items()},
        steps={name: stage.steps for name, stage in health.stages.items()},
        links={name: stage.links for name, stage in health.stages.items()},
    )


_N = TypeVar("_N", int, float)


def _delta(before: dict[str, _N | None], after: dict[str, _N | None]) -> dict[str, _N | None]:
    """A count's growth between two readings, per stage actor; None where either reading
    is missing or the count went back (the stage restarted: its new engine counts anew)."""
    delta: dict[str, _N | None] = {}
    for name, end in after.items():
        start = before.get(name)
        if start is None or end is None or end < start:
            delta[name] = None
        else:
            delta[name] = end - start
    return delta


def _steps_delta(
    before: dict[str, StepCounts | None], after: dict[str, StepCounts | None]
) -> dict[str, StepCounts | None]:
    """What each stage actor's step loop ran between two readings (:func:`_delta`'s
    rules: None where either is missing or the loop restarted)."""
    delta: dict[str, StepCounts | None] = {}
    for name, end in after.items():
        start = before.get(name)
        if start is None or end is None or end.steps < start.steps:
            delta[name] = None
        else:
            fields = StepCounts.__struct_fields__
            delta[name] = StepCounts(**{f: getattr(end, f) - getattr(start, f) for f in fields})
    return delta


def _links_delta(
    before: dict[str, LinkCounts | None], after: dict[str, LinkCounts | None]
) -> dict[str, LinkCounts | None]:
    """What each stage actor's device links sent between two readings; a stage whose
    first link came up meanwhile counts from 0 (None where the second reading is
    missing or a count went back: the stage restarted)."""
    delta: dict[str, LinkCounts | None] = {}
    zero = LinkCounts(placed=0, host=0, unmarked=0)
    for name, end in after.items():
        start = before.get(name) or zero
        if end is None or any(getattr(end, f) < getattr(start, f) for f in _LINK_FIELDS):
            delta[name] = None
        else:
            grown = {f: getattr(end, f) - getattr(start, f) for f in _LINK_FIELDS}
            delta[name] = LinkCounts(**grown)
    return delta


_LINK_FIELDS: tuple[str, ...] = LinkCounts.__struct_fields__


def _step_figures(counts: StepCounts | None, wall_s: float) -> dict[str, Any] | None:
    """A level's steps of one stage (``engine_busy[actor]["steps"]``); None: no loop."""
    if counts is None:
        return None

    def ms(seconds: float, n: int) -> float | None:
        return _ms(seconds * 1e3 / n) if n else None

    decode_only = counts.steps - counts.prefill_steps
    return {
        "steps": counts.steps,
        "steps_per_s": round(counts.steps / wall_s, 2) if wall_s > 0 else None,
        "decode_rows_per_step": round(counts.decode_rows / counts.steps, 2)
        if counts.steps
        else None,
        "prefill_tokens": counts.prefill_tokens,
        "prefill_steps": counts.prefill_steps,
        "prefill_step_ms_mean": ms(counts.prefill_step_s, counts.prefill_steps),
        "decode_step_ms_mean": ms(counts.step_s - counts.prefill_step_s, decode_only),
        "prefill_wait_ms_mean": ms(counts.prefill_wait_s, counts.prefill_works),
        "decode_wait_ms_mean": ms(counts.decode_wait_s, counts.decode_rows),
        "ahead_steps": counts.ahead_steps,
    }


async def _measure(
    omni: OmniPipeline, count: int, concurrency: int, texts: Sequence[str]
) -> tuple[list[_Sample | str], _Cost]:
    """``count`` requests at ``concurrency``, and what they took."""
    before = await _counts(omni)
    cpu, wall = tree_cpu_s(), time.perf_counter()
    results = await _drive(omni, count, concurrency, texts)
    wall_s, cpu_s = time.perf_counter() - wall, tree_cpu_s() - cpu
    return results, _cost(wall_s, cpu_s, before, await _counts(omni))


def _cost(wall_s: float, cpu_s: float, before: _Counts, after: _Counts) -> _Cost:
    """A level's cost, its engine counters read ``before`` and ``after`` its requests."""
    return _Cost(
        wall_s,
        cpu_s,
        _delta(before.busy_s, after.busy_s),
        _delta(before.eager_steps, after.eager_steps),
        _steps_delta(before.steps, after.steps),
        _links_delta(before.links, after.links),
    )


def _device(spec: PipelineSpec, actor: str) -> str:
    """Where stage actor ``actor`` (a stage, or a replica ``<stage>-<i>``) computes."""
    for stage in spec.stages:
        names = stage.replica_names()
        if actor in names:
            index = names.index(actor)
            return stage.replica_devices()[index] or str(stage.engine.args.get("device", "cpu"))
    stage = spec.stage(actor.rsplit("-", 1)[0])
    return stage.device or str(stage.engine.args.get("device", "cpu"))


def _samples(samples: list[_Sample]) -> list[dict[str, Any]]:
    """Each request's figures in the order they were sent, ``sent_ms`` after the first:
    whether a tail is a level's first burst or spread over it."""
    first = min(s.started_s for s in samples)
    return [
        {
            "sent_ms": _ms((s.started_s - first) * 1e3),
            "ttft_ms": _ms(s.ttft_ms),
            "ttfa_ms": _ms(s.ttfa_ms),
            "rtf": round(s.rtf, 4),
            "underruns": s.underruns,
        }
        for s in sorted(samples, key=lambda s: s.started_s)
    ]


def _level(
    results: list[_Sample | str],
    cost: _Cost | None = None,
    spec: PipelineSpec | None = None,
    output_tokens: int | None = None,
) -> dict[str, Any]:
    """One level's figures (module docstring); with ``cost``, also its throughput and
    what it cost (``output_tokens``: every reply's text tokens, None if unknown)."""
    samples = [r for r in results if isinstance(r, _Sample)]
    errors = [r for r in results if isinstance(r, str)]
    level: dict[str, Any] = {"requests": len(results), "errors": len(errors)}
    if samples:
        ttfa = [s.ttfa_ms for s in samples]
        ttft = [s.ttft_ms for s in samples if s.ttft_ms is not None]
        rtf = [s.rtf for s in samples]
        audio_s = sum(s.audio_s for s in samples)
        underruns = sum(s.underruns for s in samples)
        level |= {
            "ttft_ms_mean": _ms(sum(ttft) / len(ttft)) if ttft else None,
            "ttft_ms_p50": _ms(percentile(ttft, 50)) if ttft else None,
            "ttft_ms_p90": _ms(percentile(ttft, 90)) if ttft else None,
            "ttfa_ms_mean": _ms(sum(ttfa) / len(ttfa)),
            "ttfa_ms_p50": _ms(percentile(ttfa, 50)),
            "ttfa_ms_p90": _ms(percentile(ttfa, 90)),
            "ttfa_ms_p99": _ms(percentile(ttfa, 99)),
            "rtf_mean": round(sum(rtf) / len(rtf), 4),
            "rtf_p50": round(percentile(rtf, 50), 4),
            "e2e_ms_p50": _ms(percentile([s.e2e_ms for s in samples], 50)),
            "audio_s_mean": round(audio_s / len(samples), 3),
            # As bench realtime counts them: a player 200 ms behind each reply.
            "underruns": underruns,
            "underruns_per_min": round(underruns * 60.0 / audio_s, 3) if audio_s else None,
            "stall_ms": round(sum(s.stall_ms for s in samples), 1),
            "samples": _samples(samples),
        }
    if cost is not None and spec is not None:
        audio_s = sum(s.audio_s for s in samples)
        tokens = None if output_tokens is None else output_tokens * len(samples)
        level |= {
            "wall_s": round(cost.wall_s, 3),
            "output_tokens_per_s": (
                round(tokens / cost.wall_s, 2) if tokens is not None and cost.wall_s > 0 else None
            ),
            "engine_busy": {
                actor: {
                    "device": _device(spec, actor),
                    "busy_fraction": None if busy is None else round(busy / cost.wall_s, 4),
                    "eager_steps": cost.eager_steps.get(actor),
                    "steps": _step_figures(cost.steps.get(actor), cost.wall_s),
                    "links": _link_figures(cost.links.get(actor)),
                }
                for actor, busy in cost.busy_s.items()
            },
            "host_cpu_s_per_audio_s": round(cost.cpu_s / audio_s, 4) if audio_s > 0 else None,
        }
    if errors:
        level["first_error"] = errors[0]
    return level


async def run_model_bench(
    preset: str | Path,
    concurrency: list[int] | None = None,
    requests: int | None = None,
    *,
    requests_per_level: int | None = None,
    model: str | None = None,
    cache_dir: Path | None = None,
    seed: int = 0,
    output_tokens: int = 48,
    input_tokens: int | None = None,
    frames_per_token: int | None = None,
    full_edges: bool = True,
    input_audio_s: Sequence[float] = DEFAULT_INPUT_AUDIO_S,
    input_repeats: int = 3,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure ``preset`` (streaming) per concurrency level, and against its full-edge
    variant.

    Args:
        preset: a model preset name or YAML path (e.g. ``tiny-omni``, ``qwen3-omni``).
        concurrency: levels (default 1, 4, 16).
        requests: measured requests per level (default: ``requests_per_level`` x c, or
            :func:`default_requests`).
        requests_per_level: each level ``c`` measures this many times ``c`` requests,
            a closed loop of that many waves (vllm-omni's CI runs 4); not with
            ``requests`` (:func:`~omni_actors.bench.pipeline.level_requests`).
        model: the release every model stage loads instead of the preset's (a
            directory, a Hub repo id or a prepared family; as ``run --model``).
        cache_dir: the weights cache (prepared first if missing).
        seed: the weights' seed, and the random prompts'.
        output_tokens: every reply is exactly this many text tokens (see
            :func:`fixed_replies`).
        input_tokens: every prompt is random text of exactly this many tokens of the
            entry stage's tokenizer (:mod:`~omni_actors.bench.random_prompts`); None:
            the prompt ``hello``.
        frames_per_token: every reply's audio is exactly this many codec frames per
            text token (see :func:`fixed_frames`); None: the preset's own ending.
        full_edges: also measure the full-edge variant (and the stream/full ratio).
        input_audio_s: seconds of paced input audio, one figure point each (default
            5 and 60: that run alone takes about 3.5 minutes); empty: no figure.
        input_repeats: sessions per input length.
        progress: told as each step starts (preparing the weights, drawing the
            prompts, each pipeline and level, each input-length session; see
            :mod:`~omni_actors.bench.steps`).

    Returns:
        ``variants`` (per pipeline, per level: TTFT mean/p50/p90, TTFA (the first audio
        packet) mean/p50/p90/p99, RTF mean and p50, E2E p50, mean audio seconds,
        ``underruns`` of a player 200 ms behind each reply (``SessionMetrics.pacing``),
        ``underruns_per_min`` of audio and their ``stall_ms``,
        ``output_tokens_per_s`` over the level, ``engine_busy`` per stage actor (its
        device, ``busy_fraction``, None where the engine does not tell, and
        ``eager_steps``, the steps it ran eager over the level although it has CUDA
        graphs, None where it has none, and ``steps``, what its step loop ran over the
        level, None where it has none: steps and steps per second, decode rows per
        step, prefill tokens and steps, the mean time of a step with prefill chunks
        and of one without, and the mean wait of a prefill before its first chunk ran
        and of a decode row before its step),
        ``host_cpu_s_per_audio_s``, ``wall_s``, ``requests`` and ``errors``),
        ``stream_vs_full_ttfa`` per level (empty without ``full_edges``),
        ``input_length`` (TTFA and TTFT after the end of paced audio input, per input
        length, and their ratio; absent without lengths), ``reference`` (vllm-omni's
        published figures for the ``qwen3-omni`` preset; absent for others),
        ``targets``, ``machine``, ``parameters`` and ``wall_s``.

    Raises:
        PromptLengthError: ``input_tokens`` or ``output_tokens`` below 1, or the entry
            stage has no tokenizer to count prompt tokens with (before anything runs).
        InputLengthError: an input length is not a positive whole number of 20 ms
            frames (raised before anything runs).
        PipelineConfigError: ``model`` given to a pipeline that loads none, or
            ``frames_per_token`` to one without a talker.
        ValueError: a level, ``requests``, ``requests_per_level``, ``input_repeats`` or
            ``frames_per_token`` below 1, or both ``requests`` and ``requests_per_level``.
    """
    levels = concurrency or MODEL_CONCURRENCY
    for name, value in (("output_tokens", output_tokens), ("input_tokens", input_tokens)):
        if value is not None and value < 1:
            raise PromptLengthError(f"{name} must be >= 1, got {value}")
    counts = level_requests(levels, requests, requests_per_level, default_requests)
    for name, value in (
        ("concurrency", min(levels)),
        ("input_repeats", input_repeats),
        ("frames_per_token", frames_per_token),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if input_audio_s:
        check_input_lengths(input_audio_s)
    started = time.perf_counter()
    base = load_pipeline(preset).without_transcriber()  # replies are what is measured
    specs = {base.name: base} | ({"full": full_variant(base)} if full_edges else {})
    if model is not None:
        specs = {label: spec.with_model(model) for label, spec in specs.items()}
    if frames_per_token is not None:
        specs = {label: fixed_frames(spec, frames_per_token) for label, spec in specs.items()}
    families = {name: f for spec in specs.values() for name, f in spec.model_families().items()}
    steps = Steps(
        progress,
        1
        + (input_tokens is not None)
        + len(specs) * len(levels)
        + input_steps(input_audio_s, input_repeats),
    )
    steps.start("preparing the weights")
    for family in families.values():
        prepare(family, cache_dir=cache_dir, seed=seed)
    specs = {
        label: fixed_replies(spec.with_weights(cache_dir=cache_dir, seed=seed), output_tokens)
        for label, spec in specs.items()
    }
    stream = specs[base.name]
    texts: list[str] = []
    if input_tokens is not None:
        steps.start(f"drawing random prompts of {input_tokens} tokens")
        prompts = RandomPrompts(entry_vocabulary(stream), input_tokens, seed)
        texts = prompts.texts(max(_WARMUP, *counts.values()))
    replies_fixed = any("max_new_tokens" in stage.engine.args for stage in stream.stages)
    variants: dict[str, dict[str, Any]] = {}
    for spec in specs.values():
        variants[spec.name] = {}
        for c in levels:
            steps.start(f"{spec.name} c={c}")
            async with OmniPipeline(spec, max_sessions=c) as omni:
                await _drive(omni, _WARMUP, min(c, _WARMUP), texts)
                gc.collect()
                results, cost = await _measure(omni, counts[c], c, texts)
            tokens = output_tokens if replies_fixed else None
            variants[spec.name][str(c)] = _level(results, cost, spec, tokens)
    input_length: dict[str, Any] | None = None
    if input_audio_s:
        async with OmniPipeline(stream, max_sessions=1) as omni:
            input_length = await measure_input_length(
                omni, input_audio_s, input_repeats, seed=seed, steps=steps
            )
    ratios: dict[str, float | None] = {}
    if full_edges:
        full_name = specs["full"].name
        for level in map(str, levels):
            a, b = variants[stream.name][level], variants[full_name][level]
            both = "ttfa_ms_p50" in a and "ttfa_ms_p50" in b
            ratios[level] = round(a["ttfa_ms_p50"] / b["ttfa_ms_p50"], 4) if both else None
    report: dict[str, Any] = {"variants": variants, "stream_vs_full_ttfa": ratios}
    if base.name == VLLM_OMNI_2XH100.preset:
        report["reference"] = VLLM_OMNI_2XH100.report()
        targets = qwen3_omni_targets(variants[stream.name])
    else:
        targets = _cpu_targets(variants[stream.name], ratios)
    if input_length is not None:
        report["input_length"] = input_length
        ratio = input_length["ttfa_ratio"]
        targets["input_length_ttfa_ratio"] = {
            "limit": TTFA_RATIO_LIMIT,
            "measured": ratio,
            "met": None if ratio is None else ratio <= TTFA_RATIO_LIMIT,
        }
    return report | {
        "targets": targets,
        "machine": _machine(),
        "parameters": {
            "preset": str(preset),
            "model": model,
            "concurrency": levels,
            "requests": requests_parameter(requests, requests_per_level, "max(2*c, 8)"),
            "requests_per_level": requests_per_level,
            "warmup_requests": _WARMUP,
            "seed": seed,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "frames_per_token": frames_per_token,
            "full_edges": full_edges,
            "input_audio_s": sorted(input_audio_s),
            "input_repeats": input_repeats,
            # What each stage's engine ran with: a preset's variant says itself.
            "engines": {
                stage.name: {"kind": stage.engine.kind, **stage.engine.args}
                for stage in stream.stages
            },
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _cpu_targets(
    stream: dict[str, dict[str, Any]], ratios: dict[str, float | None]
) -> dict[str, Any]:
    """tiny-omni's goals on a small CPU: streaming pays off, and keeps up under load."""
    rtf_c4 = stream.get("4", {}).get("rtf_p50")
    rtf_c16 = stream.get("16", {}).get("rtf_p50")
    ratio_c1 = ratios.get("1")
    return {
        "stream_vs_full_ttfa_c1": {
            "limit": _TTFA_RATIO_LIMIT,
            "measured": ratio_c1,
            "met": None if ratio_c1 is None else ratio_c1 <= _TTFA_RATIO_LIMIT,
        },
        "rtf_c4": {
            "limit": _RTF_LIMIT,
            "measured": rtf_c4,
            "met": None if rtf_c4 is None else rtf_c4 < _RTF_LIMIT,
        },
        "rtf_c16": {
            "limit": _RTF_C16_LIMIT,
            "measured": rtf_c16,
            "met": None if rtf_c16 is None else rtf_c16 <= _RTF_C16_LIMIT,
        },
    }


def model_table(result: dict[str, Any]) -> list[str]:
    """The per-level figures of a :func:`run_model_bench` report, one row per level and
    pipeline, with vllm-omni's published TTFT and RTF beside them where the report has
    a ``reference``."""
    reference: dict[str, Any] | None = result.get("reference")
    lines: list[str] = []
    for name, levels in result["variants"].items():
        if not levels:
            continue
        first = next(iter(levels.values()))
        actors = list(first.get("engine_busy", {}))
        where = ", ".join(f"{a} {first['engine_busy'][a]['device']}" for a in actors)
        lines += ["", f"{name}" + (f" (engines: {where})" if where else "")]
        shown = reference if name == VLLM_OMNI_2XH100.preset else None
        header = f"{'c':>4}  {'ok/req':>7}  {'TTFT mean/p50':>13}"
        header += f"  {'vllm-omni':>9}" if shown is not None else ""
        header += f"  {'1st audio mean/p50/p90':>22}  {'RTF mean/p50':>13}"
        header += f"  {'vllm-omni':>9}" if shown is not None else ""
        header += f"  {'text tok/s':>10}  {'underruns':>9}  {'busy ' + '/'.join(actors):>14}"
        header += f"  {'CPU s/audio s':>13}  {'eager ' + '/'.join(actors):>15}"
        lines.append(header)
        for c, level in levels.items():
            done = f"{level['requests'] - level['errors']}/{level['requests']}"
            row = f"{c:>4}  {done:>7}  {_pair(level, 'ttft_ms_mean', 'ttft_ms_p50'):>13}"
            if shown is not None:
                row += f"  {_cell(shown['ttft_ms'].get(c)):>9}"
            packet = _pair(level, "ttfa_ms_mean", "ttfa_ms_p50", "ttfa_ms_p90")
            rtf = _pair(level, "rtf_mean", "rtf_p50", digits=3)
            row += f"  {packet:>22}  {rtf:>13}"
            if shown is not None:
                row += f"  {_cell(shown['rtf'].get(c), 3):>9}"
            busy = level.get("engine_busy", {})
            fractions = "/".join(_cell(busy.get(a, {}).get("busy_fraction"), 2) for a in actors)
            row += f"  {_cell(level.get('output_tokens_per_s'), 1):>10}"
            row += f"  {_cell(level.get('underruns')):>9}  {fractions:>14}"
            row += f"  {_cell(level.get('host_cpu_s_per_audio_s'), 3):>13}"
            eager = "/".join(_cell(busy.get(a, {}).get("eager_steps")) for a in actors)
            row += f"  {eager:>15}"
            lines.append(row)
        lines += _steps_table(levels, actors)
    if reference is not None:
        lines.append(f"vllm-omni: {reference['source']}")
    lines.append(
        "TTFT and first audio in ms; underruns: of a player 200 ms behind each reply; "
        "busy: each engine's model calls over wall time; eager: its steps run eager "
        "although it has CUDA graphs (-: no graphs); steps: each step loop's steps per "
        "second, decode rows per step, steps with prefill chunks of all, the mean step "
        "with prefill and without, the mean wait of a prefill for its first chunk "
        "and of a decode row for its step, and the messages its device links placed in "
        "a slot, sent through the host (no slot free, or too big for one) and copied "
        "unmarked (waiting for the steps queued after theirs)"
    )
    return lines


def _link_figures(counts: LinkCounts | None) -> dict[str, int] | None:
    """A level's messages over one stage's device links (``engine_busy[actor]["links"]``);
    None: the stage has none."""
    return None if counts is None else msgspec.structs.asdict(counts)


def _steps_table(levels: dict[str, Any], actors: list[str]) -> list[str]:
    """Each level's steps per stage actor with a step loop (``engine_busy[a].steps``):
    where its time went and how long work queued for it; none without loops."""
    rows = []
    for c, level in levels.items():
        for actor in actors:
            busy = level.get("engine_busy", {}).get(actor, {})
            steps, links = busy.get("steps"), busy.get("links")
            if steps is None:
                continue
            prefill = f"{steps['prefill_steps']}/{steps['steps']}"
            step_ms = _pair(steps, "prefill_step_ms_mean", "decode_step_ms_mean", digits=1)
            wait_ms = _pair(steps, "prefill_wait_ms_mean", "decode_wait_ms_mean", digits=1)
            row = f"{c:>4}  {actor:<10}  {_cell(steps['steps_per_s'], 1):>7}"
            row += f"  {_cell(steps['decode_rows_per_step'], 1):>9}  {prefill:>13}"
            row += f"  {step_ms:>21}  {wait_ms:>21}"
            row += f"  {'-' if links is None else _pair(links, *_LINK_FIELDS):>22}"
            rows.append(row)
    if not rows:
        return []
    header = f"{'c':>4}  {'steps':<10}  {'per s':>7}  {'rows/step':>9}  {'prefill/all':>13}"
    header += f"  {'ms prefill/decode':>21}  {'wait ms prefill/row':>21}"
    header += f"  {'link placed/host/unm.':>22}"
    return [header, *rows]


def _pair(level: dict[str, Any], *keys: str, digits: int = 0) -> str:
    """The figures ``keys`` of ``level`` in one cell, joined by ``/`` (``-``: missing)."""
    return "/".join(_cell(level.get(key), digits) for key in keys)


def _cell(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
