"""``omni-actors bench soak``'s command line: options, the run, a short table.

Kept apart from the benchmark (:mod:`omni_actors.bench.soak`) so the CLI parser does
not import torch until the benchmark runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omni_actors.bench.cli_args import positive_float, positive_int
from omni_actors.errors import OmniError

__all__ = ["add_soak_options", "bench_soak", "soak_table"]


def add_soak_options(parser: argparse.ArgumentParser) -> None:
    """``bench soak``'s options."""
    parser.add_argument("--preset", default="tiny-omni", help="a preset or a pipeline YAML")
    parser.add_argument(
        "--sessions", type=positive_int, default=16, help="conversations at once (16)"
    )
    parser.add_argument("--minutes", type=positive_float, default=30.0, help="run time (30)")
    parser.add_argument(
        "--interval", type=positive_float, default=10.0, help="seconds between samples (10)"
    )
    parser.add_argument(
        "--warmup-minutes",
        type=float,
        default=2.0,
        help="minutes before the growth and the slopes are measured (2)",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="model weights cache")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (0)")


def bench_soak(ns: argparse.Namespace) -> dict[str, Any]:
    """Run ``bench soak`` for the CLI: a bad option or preset exits with why."""
    from omni_actors import run
    from omni_actors.bench.soak import prepared, run_soak_bench

    try:
        spec = prepared(ns.preset, ns.cache_dir, ns.seed)
        return run(
            run_soak_bench(
                spec,
                sessions=ns.sessions,
                minutes=ns.minutes,
                interval_s=ns.interval,
                warmup_minutes=ns.warmup_minutes,
                label=str(ns.preset),
                progress=ns.progress,
            )
        )
    except (OmniError, ValueError) as exc:
        raise SystemExit(f"omni-actors bench soak: {exc}") from None


def soak_table(result: dict[str, Any]) -> list[str]:
    """Growth, slopes and what was left at the end, in a few lines."""
    slopes = ", ".join(f"{k} {v}" for k, v in result["slope_per_min"].items())
    return [
        f"{result['conversations']} conversations, {result['turns']} turns: {result['outcomes']}",
        f"RSS after warm-up {result['rss_mb_after_warmup']} MB, at the end "
        f"{result['rss_mb_end']} MB: {result['rss_growth_pct']:+.2f}% "
        f"(target < {result['target_rss_growth_pct']:g}%: met {result['met']})",
        f"slopes per minute after warm-up: {slopes}",
        f"left at the end vs the start: {result['leaked']}",
    ]
