"""``omni-actors bench TARGET``: each target is one entry in :data:`BENCH_TARGETS`.

A target says how to parse its options and how to run (returning a JSON-ready dict);
``--json`` prints that dict, otherwise it is printed as a table with the target's
summary lines under it. Adding a benchmark means adding an entry, nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_actors import run
from omni_actors.bench.chaos_cli import add_chaos_options, bench_chaos, chaos_table
from omni_actors.bench.cli_args import add_profile_option, positive_int
from omni_actors.bench.cuda_cli import add_cuda_options, bench_cuda, cuda_table
from omni_actors.bench.rollback_cli import add_rollback_options, bench_rollback
from omni_actors.bench.soak_cli import add_soak_options, bench_soak, soak_table
from omni_actors.cli.progress import StepLines
from omni_actors.errors import OmniError

__all__ = ["BENCH_TARGETS", "BenchTarget", "add_bench_arguments", "bench_command"]


@dataclass(frozen=True, slots=True)
class BenchTarget:
    """A benchmark behind ``omni-actors bench <target>``; ``run`` returns a JSON-ready dict.

    ``summary`` (optional) renders the lines of a short table printed under the text
    report, for a figure the nested key/value listing does not show at a glance.
    """

    help: str
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict[str, Any]]
    summary: Callable[[dict[str, Any]], list[str]] | None = None


# -- bench actors ------------------------------------------------------------------


def _add_actor_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--messages", type=positive_int, default=200_000, help="tells per run (default 200000)"
    )
    parser.add_argument(
        "--asks", type=positive_int, default=20_000, help="sequential asks per run (default 20000)"
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="runs; the median is reported (default 3)"
    )


def _bench_actors(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.actors import run_actor_bench

    return run(run_actor_bench(ns.messages, ns.asks, ns.repeat))


# -- bench transport ---------------------------------------------------------------


def _add_transport_options(parser: argparse.ArgumentParser) -> None:
    from omni_actors.bench.transport import SIZES

    parser.add_argument(
        "--sizes", nargs="+", choices=list(SIZES), default=list(SIZES), help="payload sizes"
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply the iteration counts by this"
    )
    parser.add_argument(
        "--iterations",
        type=positive_int,
        default=None,
        help="measured round trips per size (default: 400 up to 64KiB, 100 at 1MiB, 30 above)",
    )
    baseline = parser.add_mutually_exclusive_group()
    baseline.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="the pickle baseline script (default: benchmarks/vllm_omni_baseline.py of "
        "the checkout this package runs from)",
    )
    baseline.add_argument(
        "--no-baseline", action="store_true", help="measure without the pickle baseline"
    )
    add_profile_option(parser)


def _bench_transport(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.profiling import Profiler
    from omni_actors.bench.transport import BaselineMissingError, find_baseline, run_transport_bench

    try:
        script = None if ns.no_baseline else find_baseline(ns.baseline)
    except BaselineMissingError as exc:
        raise SystemExit(f"omni-actors bench transport: {exc}") from None
    profiler = None if ns.profile is None else Profiler(ns.profile)
    return run(run_transport_bench(ns.sizes, ns.scale, ns.iterations, script, profiler))


# -- bench pipeline ----------------------------------------------------------------


_SCRIPTED_LEVELS = [1, 8, 64]


def _add_pipeline_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=_SCRIPTED_LEVELS,
        help="requests in flight at once, one run per level (default 1 8 64; "
        "1 4 16 for a model preset)",
    )
    counts = parser.add_mutually_exclusive_group()
    counts.add_argument(
        "--requests",
        type=positive_int,
        default=None,
        help="measured requests per level (default: max(3 x concurrency, 20); "
        "max(2 x concurrency, 8) for a model preset)",
    )
    counts.add_argument(
        "--requests-per-level",
        type=positive_int,
        default=None,
        metavar="K",
        help="measured requests per level: K x concurrency, a closed loop of K waves "
        "(vllm-omni's CI runs 4: 4 at c=1, 32 at c=8, 128 at c=32)",
    )
    parser.add_argument(
        "--preset",
        default=None,
        help="a preset name or YAML path to measure instead of the built-in scripted "
        "pipelines; a model preset (tiny-omni) is measured against its full-edge variant",
    )
    add_profile_option(parser)
    parser.add_argument(
        "--placement",
        choices=("local", "process", "both"),
        default="local",
        help="scripted pipelines: every stage in this process (local, the default), each "
        "in a worker process so the wire is in the figure (process), or one run of each "
        "(both: about 2.5 min on 2 cores at the default levels, vs 40 s for local)",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="measure a cross-node hop: the preset's stages on a Ray cluster against them "
        "in local workers, requests alternating at concurrency 1; local-ray starts two "
        "Ray nodes here (entry stage on one, the rest on the other), an address uses "
        "the preset's own placements (needs the ray extra)",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="weights cache")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the prepared weights and the random prompts"
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model presets: the release every model stage loads (a directory, a Hugging "
        "Face repo id or a prepared family; default: the preset's), as run --model",
    )
    parser.add_argument(
        "--input-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="model presets: every prompt is seeded random text of exactly N tokens of the "
        "entry stage's tokenizer (default: the prompt 'hello')",
    )
    parser.add_argument(
        "--output-tokens",
        "--reply-tokens",
        dest="output_tokens",
        type=positive_int,
        default=48,
        metavar="N",
        help="model presets: every reply is exactly N text tokens, end of text ignored "
        "(default 48)",
    )
    parser.add_argument(
        "--frames-per-token",
        type=positive_int,
        default=None,
        metavar="N",
        help="model presets: every reply's audio is exactly N codec frames per text token, "
        "codec EOS ignored (default: the preset's own ending; random weights may speak "
        "until the talker's max_frames)",
    )
    parser.add_argument(
        "--streaming-only",
        action="store_true",
        help="model presets: measure the preset as it is, without its full-edge variant",
    )
    _add_input_length_options(
        parser,
        prefix="model presets: ",
        points="seconds of audio fed in paced 20 ms frames, one point each of the "
        "TTFA-after-input figure (default 5 60: about 3.5 min with 3 repeats)",
        repeats=3,
        statistic="the p50",
    )


def _add_input_length_options(
    parser: argparse.ArgumentParser, *, prefix: str, points: str, repeats: int, statistic: str
) -> None:
    """``--input-audio-s`` / ``--no-input-length`` and ``--input-repeats``: the
    TTFA-by-input-length figure of ``bench pipeline`` and ``bench realtime``."""
    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument(
        "--input-audio-s",
        type=_input_seconds,
        nargs="+",
        default=None,
        metavar="SECONDS",
        help=prefix + points,
    )
    lengths.add_argument(
        "--no-input-length",
        action="store_true",
        help=prefix + "skip the TTFA-vs-input-length figure",
    )
    parser.add_argument(
        "--input-repeats",
        type=positive_int,
        default=repeats,
        help=f"{prefix}sessions per input length; {statistic} is reported (default {repeats})",
    )


def _input_seconds(text: str) -> float:
    from omni_actors.bench.input_length import InputLengthError, check_input_lengths

    try:
        return check_input_lengths([float(text)])[0]
    except ValueError as exc:  # InputLengthError is one too
        reason = str(exc) if isinstance(exc, InputLengthError) else f"not a number: {text!r}"
        raise argparse.ArgumentTypeError(reason) from None


def _input_lengths(ns: argparse.Namespace) -> tuple[float, ...]:
    from omni_actors.bench.input_length import DEFAULT_INPUT_AUDIO_S

    if ns.no_input_length:
        return ()
    return DEFAULT_INPUT_AUDIO_S if ns.input_audio_s is None else tuple(ns.input_audio_s)


def _bench_pipeline(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.ideal import IdealUnavailableError, ideal_times
    from omni_actors.bench.input_length import InputLengthError, check_input_lengths
    from omni_actors.bench.pipeline import PLACEMENTS, bench_specs, run_pipeline_bench
    from omni_actors.bench.profiling import Profiler
    from omni_actors.pipeline.spec.pipeline import PipelineConfigError

    if ns.cluster is not None:
        from omni_actors.bench.cluster_cli import bench_cluster

        model_only = _model_options(ns)
        if model_only:
            raise SystemExit(
                f"omni-actors bench pipeline: {model_only} measures a model preset on "
                "local stages; --cluster measures the cross-node hop"
            )
        return bench_cluster(ns)
    try:  # fail before anything runs, with the reason rather than a traceback
        lengths = _input_lengths(ns)
        if lengths:
            check_input_lengths(lengths)
        specs = bench_specs(ns.preset)
        if ns.preset is not None:
            from omni_actors.bench.models import is_model_pipeline, run_model_bench

            if any(is_model_pipeline(spec) for spec in specs.values()):
                if ns.profile is not None:
                    raise SystemExit(
                        "omni-actors bench pipeline: --profile profiles the scripted "
                        "pipelines; a model preset's CPU is its engines' (use py-spy)"
                    )
                # Real models: streaming against full edges (no ideal to compare with).
                levels = None if ns.concurrency == _SCRIPTED_LEVELS else ns.concurrency
                try:
                    return run(
                        run_model_bench(
                            ns.preset,
                            levels,
                            ns.requests,
                            requests_per_level=ns.requests_per_level,
                            model=ns.model,
                            cache_dir=ns.cache_dir,
                            seed=ns.seed,
                            output_tokens=ns.output_tokens,
                            input_tokens=ns.input_tokens,
                            frames_per_token=ns.frames_per_token,
                            full_edges=not ns.streaming_only,
                            input_audio_s=lengths,
                            input_repeats=ns.input_repeats,
                            progress=ns.progress,
                        )
                    )
                except OmniError as exc:  # e.g. engine arguments the engine rejects
                    raise SystemExit(f"omni-actors bench pipeline: {exc}") from None
        if ns.input_audio_s is not None:
            raise SystemExit(
                "omni-actors bench pipeline: --input-audio-s measures a model preset's "
                "audio input; add --preset tiny-omni (scripted pipelines take no audio)"
            )
        model_only = _model_options(ns)
        if model_only:
            raise SystemExit(
                f"omni-actors bench pipeline: {model_only} measures a model preset; add "
                "--preset tiny-omni or --preset qwen3-omni (scripted pipelines have no "
                "tokenizer, release or talker)"
            )
        for spec in specs.values():
            ideal_times(spec)
    except (PipelineConfigError, IdealUnavailableError, InputLengthError) as exc:
        raise SystemExit(f"omni-actors bench pipeline: {exc}") from None
    placements = PLACEMENTS if ns.placement == "both" else (ns.placement,)
    profiler = None if ns.profile is None else Profiler(ns.profile)
    return run(
        run_pipeline_bench(
            ns.concurrency,
            ns.requests,
            ns.preset,
            placements,
            profiler,
            ns.progress,
            requests_per_level=ns.requests_per_level,
        )
    )


def _model_options(ns: argparse.Namespace) -> str:
    """The options given that only a model preset takes, as the command line names them
    ("" if none)."""
    given = [
        ("--model", ns.model is not None),
        ("--input-tokens", ns.input_tokens is not None),
        ("--frames-per-token", ns.frames_per_token is not None),
        ("--streaming-only", ns.streaming_only),
    ]
    return ", ".join(option for option, on in given if on)


def _pipeline_summary(result: dict[str, Any]) -> list[str]:
    from omni_actors.bench.input_length import input_length_table
    from omni_actors.bench.models import model_table

    lines = model_table(result) if "placements" not in result and "variants" in result else []
    section = result.get("input_length")
    return lines + (input_length_table(section) if section is not None else [])


# -- bench realtime ----------------------------------------------------------------


def _add_realtime_options(parser: argparse.ArgumentParser) -> None:
    from omni_actors.bench.realtime import DEFAULT_INPUT_REPEATS, DEFAULT_SESSIONS

    parser.add_argument("--preset", default="tiny-omni", help="preset name or YAML path")
    parser.add_argument(
        "--url",
        default=None,
        metavar="WS_URL",
        help="drive the server running at ws://HOST:PORT/v1/realtime (omni-actors serve) "
        "instead of starting one on --preset; its CPU time is not read",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="the --url server's key (serve --api-key), sent as 'Authorization: Bearer'; "
        "default $OMNI_ACTORS_API_KEY",
    )
    parser.add_argument(
        "--sessions",
        type=positive_int,
        nargs="+",
        default=list(DEFAULT_SESSIONS),
        help="concurrent sessions, one level each (default 1 4 16)",
    )
    parser.add_argument(
        "--turns",
        type=positive_int,
        default=3,
        help="spoken turns per session; the last one's response is cancelled (default 3)",
    )
    parser.add_argument(
        "--speech-s",
        type=_input_seconds,
        default=3.0,
        metavar="SECONDS",
        help="seconds of speech per turn, paced in 20 ms frames (default 3)",
    )
    _add_input_length_options(
        parser,
        prefix="",
        points="TTFA after the end of speech per input length, one session at a time "
        "(default 5 60: about 2.5 min with 2 repeats)",
        repeats=DEFAULT_INPUT_REPEATS,
        statistic="the median",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="weights cache")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the speech")
    parser.add_argument(
        "--reply-tokens",
        type=positive_int,
        default=48,
        help="every reply is exactly this many text tokens (default 48)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=120.0,
        help="a client's deadline for each step, e.g. a response from commit to done (default 120)",
    )


def _bench_realtime(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.realtime import run_realtime_bench

    try:
        return run(
            run_realtime_bench(
                ns.preset,
                ns.sessions,
                turns=ns.turns,
                speech_s=ns.speech_s,
                input_audio_s=_input_lengths(ns),
                input_repeats=ns.input_repeats,
                cache_dir=ns.cache_dir,
                seed=ns.seed,
                reply_tokens=ns.reply_tokens,
                timeout_s=ns.timeout_s,
                progress=ns.progress,
                url=ns.url,
                api_key=_api_key(ns),
            )
        )
    except (OmniError, ValueError) as exc:  # a bad option, preset, or a server that failed
        raise SystemExit(f"omni-actors bench realtime: {exc}") from None


def _api_key(ns: argparse.Namespace) -> str | None:
    """``--api-key``, else ``$OMNI_ACTORS_API_KEY``: for a ``--url`` server only (the
    bench's own server takes no key). Not ``$OPENAI_API_KEY``: a bench pointed at a
    server must not hand it a key meant for another service."""
    from omni_actors.bench.server_process import API_KEY_ENV

    key: str | None = ns.api_key or os.environ.get(API_KEY_ENV) or None
    if ns.api_key is not None and ns.url is None:
        raise SystemExit("omni-actors bench realtime: --api-key is for a --url server")
    return key if ns.url is not None else None


def _realtime_summary(result: dict[str, Any]) -> list[str]:
    from omni_actors.bench.realtime import realtime_table

    return realtime_table(result)


# -- bench load ----------------------------------------------------------------------


def _stage_device(text: str) -> tuple[str, str]:
    stage, _, device = text.partition("=")
    if stage not in ("thinker", "talker", "code2wav") or not device:
        raise argparse.ArgumentTypeError(f"{text!r}: expected STAGE=DEVICE, e.g. thinker=cuda:0")
    return stage, device


def _add_release_options(
    parser: argparse.ArgumentParser, *, model_default: str | None, stage_help: str
) -> None:
    """``--model``, ``--stage STAGE=DEVICE`` (repeated), ``--cache-dir`` and ``--seed``:
    what a bench on a release's stages takes."""
    parser.add_argument(
        "--model",
        required=model_default is None,
        default=model_default,
        help="a release directory, a Hugging Face repo id, or a prepared family (tiny-omni)",
    )
    parser.add_argument(
        "--stage",
        type=_stage_device,
        action="append",
        default=[],
        metavar="STAGE=DEVICE",
        help=stage_help,
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="weights cache")
    parser.add_argument("--seed", type=int, default=0, help="seed of a prepared family's weights")


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    _add_release_options(
        parser,
        model_default=None,
        stage_help="load STAGE on DEVICE, in the order given (default: every stage on cpu)",
    )


def _bench_load(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.load import run_load_bench
    from omni_actors.models.cache import locate

    devices = dict(ns.stage) or {"thinker": "cpu", "talker": "cpu", "code2wav": "cpu"}
    try:
        prefixes = tuple(f"{stage}." for stage in devices)
        model = locate(ns.model, cache_dir=ns.cache_dir, seed=ns.seed, prefixes=prefixes)
        return run_load_bench(model, devices)
    except OmniError as exc:
        raise SystemExit(f"omni-actors bench load: {exc}") from None


# -- bench decode --------------------------------------------------------------------


def _add_decode_options(parser: argparse.ArgumentParser) -> None:
    _add_release_options(
        parser,
        model_default="tiny-omni",
        stage_help="measure STAGE (thinker, talker) on DEVICE, in the order given (default: "
        "both on cpu)",
    )
    parser.add_argument(
        "--batch",
        type=positive_int,
        nargs="+",
        default=[1, 8, 32],
        help="sessions per step (default 1 8 32)",
    )
    parser.add_argument(
        "--context", type=positive_int, default=1024, help="positions per session (1024)"
    )
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps (20)")
    parser.add_argument(
        "--max-context",
        type=positive_int,
        default=2048,
        help="positions per slot of the static cache (2048)",
    )
    parser.add_argument(
        "--talker-compile",
        choices=("default", "off", "layers", "predictor", "all", "apart"),  # as COMPILE_CHOICES
        default="default",
        help="what of the talker's static frame step to torch.compile: its decoder layers, "
        "its code-predictor step, both (the predictor's projections fused), both with those "
        "projections apart, or as its engine does (default: all, on a GPU)",
    )
    parser.add_argument(
        "--thinker-compile",
        choices=("default", "off", "on"),
        default="default",
        help="torch.compile the thinker's decode layers: as its engine does (default: on a "
        "GPU), never, or always",
    )
    parser.add_argument(
        "--compile-backend", default="inductor", help="the torch.compile backend (inductor)"
    )
    parser.add_argument(
        "--decode-attention",
        choices=("gather", "triton"),
        default="triton",
        help="how decode rows (thinker and talker) attend their slots: read in place by a "
        "Triton kernel where it serves (default, as the engines), or a gathered copy of each "
        "span",
    )
    parser.add_argument(
        "--fused-min-blocks",
        type=int,
        default=None,
        metavar="N",
        help="decode attention runs PyTorch's fused kernel from N (row, key head) pairs up, "
        "and two matrix products below (default: the engines' own, 64; 0: always fused)",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="the talker captures every batch bucket and span's graph at load, as its "
        "engine does (its load_s then counts it; the thinker always does)",
    )


def _bench_decode(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.decode import run_decode_bench
    from omni_actors.models.cache import locate

    stages = dict(ns.stage) or {"thinker": "cpu", "talker": "cpu"}
    try:
        prefixes = tuple(f"{stage}." for stage in stages)
        model = locate(ns.model, cache_dir=ns.cache_dir, seed=ns.seed, prefixes=prefixes)
        return run_decode_bench(
            model,
            stages=stages,
            batches=ns.batch,
            context=ns.context,
            steps=ns.steps,
            max_context=ns.max_context,
            talker_compile=ns.talker_compile,
            thinker_compile={"default": None, "off": False, "on": True}[ns.thinker_compile],
            compile_backend=ns.compile_backend,
            warm=ns.warm,
            fused_min_blocks=ns.fused_min_blocks,
            decode_attention=ns.decode_attention,
        )
    except (OmniError, ValueError) as exc:
        raise SystemExit(f"omni-actors bench decode: {exc}") from None


def _decode_summary(result: dict[str, Any]) -> list[str]:
    lines = ["stage    device   batch  eager_ms  static_ms"]
    for stage in ("thinker", "talker"):
        if stage in result:
            for batch, row in result[stage]["batches"].items():
                lines.append(
                    f"{stage:<8} {result[stage]['device']:<8} {batch:>5}  {row['eager_ms']:>8.2f}"
                    f"  {row['static_ms']:>9.2f}"
                )
    return lines


# -- bench boundary ------------------------------------------------------------------


def _add_boundary_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="tiny-omni",
        help="a release directory, a Hugging Face repo id, or a prepared family (tiny-omni)",
    )
    parser.add_argument(
        "--left-context",
        type=int,
        nargs="+",
        default=[0, 4, 12, 25, 50, 72],
        help="left context frames to measure (default 0 4 12 25 50 72)",
    )
    parser.add_argument("--initial-frames", type=positive_int, default=4, help="first chunk")
    parser.add_argument("--frames", type=positive_int, default=25, help="new frames per chunk")
    parser.add_argument(
        "--utterance-frames", type=positive_int, default=200, help="frames decoded (200: 16 s)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--cache-dir", type=Path, default=None, help="weights cache")
    parser.add_argument("--seed", type=int, default=0, help="seed of the codes and a family")


def _bench_boundary(ns: argparse.Namespace) -> dict[str, Any]:
    from omni_actors.bench.boundary import run_boundary_bench
    from omni_actors.models.cache import locate

    try:
        model = locate(ns.model, cache_dir=ns.cache_dir, seed=ns.seed, prefixes=("code2wav.",))
        return run(
            run_boundary_bench(
                model,
                left_contexts=ns.left_context,
                initial_frames=ns.initial_frames,
                frames=ns.frames,
                utterance_frames=ns.utterance_frames,
                device=ns.device,
                seed=ns.seed,
            )
        )
    except (OmniError, ValueError) as exc:
        raise SystemExit(f"omni-actors bench boundary: {exc}") from None


def _boundary_summary(result: dict[str, Any]) -> list[str]:
    lines = ["left_context  chunks  max_err    rms_err    boundary_max  boundary_rms  signal_rms"]
    for context, row in result["left_context"].items():
        lines.append(
            f"{context:>12}  {row['chunks']:>6}  {row['max_error']:.3e}  {row['rms_error']:.3e}"
            f"  {row['boundary_max_error']:.3e}     {row['boundary_rms_error']:.3e}"
            f"     {row['signal_rms']:.3e}"
        )
    return lines


BENCH_TARGETS: dict[str, BenchTarget] = {
    "actors": BenchTarget(
        "tell throughput vs a bare asyncio.Queue hop, and ask latency",
        _add_actor_options,
        _bench_actors,
    ),
    "transport": BenchTarget(
        "payload ping-pong between processes vs a pickle+shm baseline, raw ZeroMQ, memcpy",
        _add_transport_options,
        _bench_transport,
    ),
    "pipeline": BenchTarget(
        "time to first audio of scripted omni pipelines (stream vs full edges) vs the "
        "ideal from declared latencies, per concurrency level; a model preset (--preset "
        "qwen3-omni --model DIR): TTFT, first audio packet and RTF (mean and p50), text "
        "tokens/s, underruns, engine busy and host CPU per audio second, on random "
        "prompts of --input-tokens",
        _add_pipeline_options,
        _bench_pipeline,
        _pipeline_summary,
    ),
    "rollback": BenchTarget(
        "time to the next reply's first text token after a clear or a truncate, beside a "
        "turn with no rollback (a model preset: tiny-omni-vllm, tiny-omni)",
        add_rollback_options,
        bench_rollback,
    ),
    "realtime": BenchTarget(
        "the realtime server (a process of its own) under N concurrent websocket sessions "
        "of paced speech: TTFA, cancel latency, RTF, errors, server CPU per session-second",
        _add_realtime_options,
        _bench_realtime,
        _realtime_summary,
    ),
    "cuda": BenchTarget(
        "a GPU stage's step time handing each step's hidden states to another process "
        "(none, sync .cpu(), async staging), the hop, tiny-omni TTFA, a code-predictor graph",
        add_cuda_options,
        bench_cuda,
        cuda_table,
    ),
    "soak": BenchTarget(
        "N conversations at once for M minutes: RSS of every process, FDs, /dev/shm, child "
        "processes, tasks and live sessions sampled; growth and slopes after the warm-up",
        add_soak_options,
        bench_soak,
        soak_table,
    ),
    "boundary": BenchTarget(
        "code2wav streamed under a chunk policy vs decoded one-shot, per left context: max "
        "and RMS sample error overall and right after each window boundary",
        _add_boundary_options,
        _bench_boundary,
        _boundary_summary,
    ),
    "load": BenchTarget(
        "each stage of a Qwen3-Omni release loaded onto its device as its engine loads it: "
        "seconds, weights, shards opened, peak GPU memory, host memory at its peak",
        _add_load_options,
        _bench_load,
    ),
    "decode": BenchTarget(
        "the thinker's decode step and the talker's frame per batch size, through each "
        "stage's step loop: eager against replayed from CUDA graphs (on a GPU)",
        _add_decode_options,
        _bench_decode,
        _decode_summary,
    ),
    "chaos": BenchTarget(
        "conversations while random stage workers are SIGKILLed, clients leave mid-reply "
        "and chunks are dropped or duplicated: turns by outcome, conversations lost, hung "
        "turns, recovery time, leaks",
        add_chaos_options,
        bench_chaos,
        chaos_table,
    ),
}


# -- bench -------------------------------------------------------------------------


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """One subcommand per target, each with ``--json`` and its own options."""
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, target in BENCH_TARGETS.items():
        sub = targets.add_parser(name, help=target.help, description=target.help)
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.add_argument(
            "--quiet", action="store_true", help="no progress lines on stderr (slow benches)"
        )
        target.add_options(sub)


def _print_table(result: dict[str, Any], indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            _print_table(value, indent + "  ")
        else:
            print(f"{indent}{key:<28} {value}")


def bench_command(ns: argparse.Namespace) -> int:
    """Run the target ``ns.target`` and print its numbers."""
    target = BENCH_TARGETS[ns.target]
    # Benches that run for minutes report each step here (stderr: stdout is the report).
    ns.progress = None if ns.quiet else StepLines(f"bench {ns.target}")
    result = target.run(ns)
    if ns.json:
        print(json.dumps(result))
    else:
        _print_table(result)
        for line in target.summary(result) if target.summary is not None else []:
            print(line)
    # A report that names rows that failed is printed whole, then exits 1.
    return 1 if result.get("failed_rows") else 0
