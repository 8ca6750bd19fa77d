"""``omni-actors bench cuda``'s command line: options, the run, a short table.

Kept apart from the benchmark (:mod:`omni_actors.bench.cuda`) so the CLI parser does
not import torch until the benchmark runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_actors.bench.cli_args import positive_int
from omni_actors.errors import OmniError

if TYPE_CHECKING:
    from omni_actors.bench.cuda import CudaBenchConfig

__all__ = [
    "SIZES",
    "TARGET_ASYNC_OVERHEAD_PCT",
    "add_cuda_options",
    "bench_cuda",
    "cuda_config",
    "cuda_table",
]

SIZES = ("decode", "prefill")
TARGET_ASYNC_OVERHEAD_PCT = 2.0


def _sizes(text: str) -> tuple[str, ...]:
    sizes = tuple(s.strip() for s in text.split(",") if s.strip())
    if not sizes or not set(sizes) <= set(SIZES):
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(SIZES)}")
    return sizes


def add_cuda_options(parser: argparse.ArgumentParser) -> None:
    """``bench cuda``'s options; a count left out takes the device's default."""
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if any)")
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="measured steps per mode and size (200; cpu: 20)",
    )
    parser.add_argument(
        "--warmup",
        type=positive_int,
        default=None,
        help="warm-up steps per run of a mode (5; cpu: 3)",
    )
    parser.add_argument("--sizes", type=_sizes, default=None, help="decode,prefill (both)")
    parser.add_argument(
        "--hidden", type=positive_int, default=None, help="model width (4096; cpu: 64)"
    )
    parser.add_argument("--layers", type=positive_int, default=None, help="MLP blocks (24; cpu: 2)")
    parser.add_argument(
        "--tokens-decode", type=positive_int, default=None, help="per decode step (32; cpu: 4)"
    )
    parser.add_argument(
        "--tokens-prefill", type=positive_int, default=None, help="per prefill step (2048; cpu: 64)"
    )
    parser.add_argument(
        "--pipeline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tiny-omni TTFA with async vs sync copies (default: on for cuda, off for cpu)",
    )
    parser.add_argument(
        "--graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure steps replayed from CUDA graphs (default: on for cuda)",
    )
    parser.add_argument(
        "--requests", type=positive_int, default=None, help="tiny-omni requests (8)"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="tiny-omni weights cache")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (0)")


def cuda_config(ns: argparse.Namespace) -> CudaBenchConfig:
    """The config the parsed options of :func:`add_cuda_options` ask for.

    Raises:
        ValueError: see :meth:`CudaBenchConfig.for_device`.
    """
    names = ("steps", "warmup", "sizes", "hidden", "layers", "tokens_decode", "tokens_prefill")
    given = {
        n: getattr(ns, n)
        for n in (*names, "pipeline", "graph", "requests")
        if getattr(ns, n) is not None
    }
    from omni_actors.bench.cuda import CudaBenchConfig

    return CudaBenchConfig.for_device(ns.device, cache_dir=ns.cache_dir, seed=ns.seed, **given)


def bench_cuda(ns: argparse.Namespace) -> dict[str, Any]:
    """Run ``bench cuda`` for the CLI: a bad option or a lost hand-off exits with why."""
    from omni_actors import run
    from omni_actors.bench.cuda import run_cuda_bench

    try:
        return run(run_cuda_bench(cuda_config(ns)))
    except (OmniError, ValueError) as exc:
        raise SystemExit(f"omni-actors bench cuda: {exc}") from None


def cuda_table(result: dict[str, Any]) -> list[str]:
    """The run in a few lines: step time per mode and size, hops, the link's wait for a
    step, tiny-omni, the predictor; a failed row shows its error."""
    rows = [
        f"hand-off per step on {result['device']} (step ms p50, overhead vs none; hop: the "
        "ask's round trip ms p50, async and sync paths)",
        f"{'size':<8} {'bytes':>10} {'none':>8} {'sync':>17} {'ours':>17} {'hop':>7} "
        f"{'hop sync':>8}  met (ours <= {TARGET_ASYNC_OVERHEAD_PCT:g}%)",
    ]
    for size, row in result["sizes"].items():
        if "error" in row:
            rows.append(f"{size:<8} failed: {row['error']}")
            continue
        m = row["modes"]
        sync = f"{m['sync']['step_ms_p50']:.3f} ({row['sync_overhead_pct']:+.1f}%)"
        ours = f"{m['ours']['step_ms_p50']:.3f} ({row['async_overhead_pct']:+.1f}%)"
        rows.append(
            f"{size:<8} {row['bytes']:>10} {m['none']['step_ms_p50']:>8.3f} {sync:>17} "
            f"{ours:>17} {row['hop_ms_p50']:>7.3f} {row['hop_sync_ms_p50']:>8.3f}  {row['met']}"
        )
    rows.append(f"hop paths (ms p50): {_hop_paths(result['hop_paths'])}")
    rows.append(f"link copy after its step (ms p50): {_link_ready(result['link_ready'])}")
    tiny = result["tiny_omni"]
    if "skipped" in tiny or "error" in tiny:
        rows.append(f"tiny-omni: {_not_run(tiny)}")
    else:
        a, h, s = tiny["async"], tiny["async_host"], tiny["sync"]
        rows.append(
            f"tiny-omni TTFA p50 ms: device links {a['ttfa_ms_p50']}, host async "
            f"{h['ttfa_ms_p50']}, host sync {s['ttfa_ms_p50']} (links/sync "
            f"{tiny['async_vs_sync_ttfa']}; errors {a['errors']}+{h['errors']}+{s['errors']})"
        )
    cp = result["code_predictor"]
    if "skipped" in cp or "error" in cp:
        rows.append(f"code predictor: {_not_run(cp)}")
    else:
        graph = cp["graph_frame_ms_p50"]
        rows.append(
            f"code predictor per frame ms p50: eager {cp['eager_frame_ms_p50']}, graph "
            f"{graph if graph is not None else cp['graph']} (exact: {cp.get('exact')})"
        )
    if result.get("failed_rows"):
        rows.append(f"failed rows: {', '.join(result['failed_rows'])}")
    return rows


def _not_run(row: dict[str, Any]) -> str:
    return f"failed ({row['error']})" if "error" in row else f"skipped ({row['skipped']})"


def _hop_paths(paths: dict[str, Any]) -> str:
    if "skipped" in paths or "error" in paths:
        return _not_run(paths)
    parts = []
    for path, row in paths.items():
        if "skipped" in row or "error" in row:
            parts.append(f"{path} {_not_run(row)}")
        elif "refused" in row:
            parts.append(f"{path} refused ({row['refused']})")
        else:
            sizes = ", ".join(
                f"{label} {value['hop_ms_p50']}"
                for label, value in row.items()
                if isinstance(value, dict)
            )
            parts.append(f"{path} {sizes}")
    return "; ".join(parts)


def _link_ready(row: dict[str, Any]) -> str:
    if "skipped" in row or "error" in row:
        return _not_run(row)
    return (
        f"waiting on the stream {row['stream']['copy_after_step_ms_p50']}, on the step's "
        f"mark {row['step']['copy_after_step_ms_p50']} ({row['rows']} rows a step)"
    )
