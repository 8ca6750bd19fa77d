"""Benchmark of a model pipeline (``bench pipeline --preset tiny-omni``): streaming edges
against full-payload edges, on the real models.

A model pipeline has no ideal latency to compare with; what matters is how much sooner
streaming delivers the first audio than waiting for each stage to finish (vllm-omni's
published async-chunk gain is 6459 -> 523 ms), and whether the audio comes faster than
real time under load. Both variants run the same weights, one after the other, each on a
fresh warmed-up pipeline per concurrency level. Then the streaming pipeline is fed paced
audio of each input length (:mod:`omni_actors.bench.input_length`): the time to first
audio after the end of the input should not grow with its length.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omni_actors.bench.input_length import (
    DEFAULT_INPUT_AUDIO_S,
    TTFA_RATIO_LIMIT,
    check_input_lengths,
    input_steps,
    measure_input_length,
)
from omni_actors.bench.pipeline import _drive, _machine, _ms, _Sample
from omni_actors.bench.stats import percentile
from omni_actors.bench.steps import Progress, Steps
from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineConfigError, PipelineSpec, load_pipeline

__all__ = ["MODEL_CONCURRENCY", "full_variant", "is_model_pipeline", "run_model_bench"]

MODEL_CONCURRENCY = [1, 4, 16]
_WARMUP = 2
_TTFA_RATIO_LIMIT = 0.35  # streaming TTFA / full TTFA at concurrency 1
_RTF_LIMIT = 1.0  # at concurrency 4
# At concurrency 16 on a 2-core CPU: half of tiny-omni's 1.28 before sessions were batched.
_RTF_C16_LIMIT = 0.64


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


def _level(results: list[_Sample | str]) -> dict[str, Any]:
    samples = [r for r in results if isinstance(r, _Sample)]
    errors = [r for r in results if isinstance(r, str)]
    level: dict[str, Any] = {"requests": len(results), "errors": len(errors)}
    if samples:
        ttfa = [s.ttfa_ms for s in samples]
        level |= {
            "ttfa_ms_p50": _ms(percentile(ttfa, 50)),
            "ttfa_ms_p99": _ms(percentile(ttfa, 99)),
            "rtf_p50": round(percentile([s.rtf for s in samples], 50), 4),
            "e2e_ms_p50": _ms(percentile([s.e2e_ms for s in samples], 50)),
        }
    if errors:
        level["first_error"] = errors[0]
    return level


async def run_model_bench(
    preset: str | Path,
    concurrency: list[int] | None = None,
    requests: int | None = None,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    reply_tokens: int = 48,
    input_audio_s: Sequence[float] = DEFAULT_INPUT_AUDIO_S,
    input_repeats: int = 3,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure ``preset`` (streaming) against its full-edge variant.

    Args:
        preset: a model preset name or YAML path (e.g. ``tiny-omni``).
        concurrency: levels (default 1, 4, 16).
        requests: measured requests per level (default ``max(2 * c, 8)``).
        cache_dir: the weights cache (prepared first if missing).
        seed: the weights' seed.
        reply_tokens: every reply is exactly this many text tokens (see
            :func:`fixed_replies`).
        input_audio_s: seconds of paced input audio, one figure point each (default
            5 and 60: that run alone takes about 3.5 minutes); empty: no figure.
        input_repeats: sessions per input length.
        progress: told as each step starts (preparing the weights, each pipeline and
            level, each input-length session; see :mod:`~omni_actors.bench.steps`).

    Returns:
        ``variants`` (per pipeline, per level: TTFA p50/p99, RTF p50, E2E p50, errors),
        ``stream_vs_full_ttfa`` per level, ``input_length`` (TTFA and TTFT after the
        end of paced audio input, per input length, and their ratio; absent without
        lengths), ``targets`` and ``machine``.

    Raises:
        InputLengthError: an input length is not a positive whole number of 20 ms
            frames (raised before anything runs).
    """
    levels = concurrency or MODEL_CONCURRENCY
    if input_audio_s:
        check_input_lengths(input_audio_s)
    if input_repeats < 1:
        raise ValueError(f"input_repeats must be >= 1, got {input_repeats}")
    started = time.perf_counter()
    stream = load_pipeline(preset)
    specs = {stream.name: stream, "full": full_variant(stream)}
    families = {name: f for spec in specs.values() for name, f in spec.model_families().items()}
    steps = Steps(
        progress, 1 + len(specs) * len(levels) + input_steps(input_audio_s, input_repeats)
    )
    steps.start("preparing the weights")
    for family in families.values():
        prepare(family, cache_dir=cache_dir, seed=seed)
    variants: dict[str, dict[str, Any]] = {}
    for label, spec in specs.items():
        spec = fixed_replies(spec.with_weights(cache_dir=cache_dir, seed=seed), reply_tokens)
        variants[spec.name] = {}
        for c in levels:
            count = requests if requests is not None else max(2 * c, 8)
            steps.start(f"{spec.name} c={c}")
            async with OmniPipeline(spec, max_sessions=c) as omni:
                await _drive(omni, _WARMUP, min(c, _WARMUP))
                gc.collect()
                variants[spec.name][str(c)] = _level(await _drive(omni, count, c))
        specs[label] = spec
    input_length: dict[str, Any] | None = None
    if input_audio_s:
        async with OmniPipeline(specs[stream.name], max_sessions=1) as omni:
            input_length = await measure_input_length(
                omni, input_audio_s, input_repeats, seed=seed, steps=steps
            )
    stream_name, full_name = stream.name, specs["full"].name
    ratios: dict[str, float | None] = {}
    for level in map(str, levels):
        a, b = variants[stream_name][level], variants[full_name][level]
        both = "ttfa_ms_p50" in a and "ttfa_ms_p50" in b
        ratios[level] = round(a["ttfa_ms_p50"] / b["ttfa_ms_p50"], 4) if both else None
    rtf_c4 = variants[stream_name].get("4", {}).get("rtf_p50")
    rtf_c16 = variants[stream_name].get("16", {}).get("rtf_p50")
    ratio_c1 = ratios.get("1")
    targets: dict[str, Any] = {
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
    report: dict[str, Any] = {"variants": variants, "stream_vs_full_ttfa": ratios}
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
            "concurrency": levels,
            "requests": requests if requests is not None else "max(2*c, 8)",
            "warmup_requests": _WARMUP,
            "seed": seed,
            "reply_tokens": reply_tokens,
            "input_audio_s": sorted(input_audio_s),
            "input_repeats": input_repeats,
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
