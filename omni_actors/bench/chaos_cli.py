"""``omni-actors bench chaos``'s command line: options, the run, a short table.

Kept apart from the benchmark (:mod:`omni_actors.bench.chaos`) so the CLI parser does
not import torch until the benchmark runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omni_actors.errors import OmniError

__all__ = ["add_chaos_options", "bench_chaos", "chaos_table"]


def add_chaos_options(parser: argparse.ArgumentParser) -> None:
    """``bench chaos``'s options (ranges are checked by ``ChaosConfig.check``)."""
    parser.add_argument("--preset", default="tiny-omni", help="a preset or a pipeline YAML")
    parser.add_argument("--sessions", type=int, default=16, help="conversations at once (16)")
    parser.add_argument("--seconds", type=float, default=120.0, help="run time (120)")
    parser.add_argument(
        "--kill-every", type=float, default=10.0, help="seconds between worker kills (10)"
    )
    parser.add_argument(
        "--disconnect-p",
        type=float,
        default=0.05,
        help="chance a client leaves in the middle of a reply (0.05)",
    )
    parser.add_argument(
        "--chunk-faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="drop one chunk in --drop-every on a random edge, duplicate one in "
        "--duplicate-every on another (on)",
    )
    parser.add_argument("--drop-every", type=int, default=500, help="(500)")
    parser.add_argument("--duplicate-every", type=int, default=300, help="(300)")
    parser.add_argument("--seed", type=int, default=0, help="the faults' and the weights' seed")
    parser.add_argument("--cache-dir", type=Path, default=None, help="model weights cache")


def bench_chaos(ns: argparse.Namespace) -> dict[str, Any]:
    """Run ``bench chaos`` for the CLI: a bad option or preset exits with why."""
    from omni_actors import run
    from omni_actors.bench.chaos import ChaosConfig, run_chaos_bench
    from omni_actors.bench.soak import prepared

    config = ChaosConfig(
        sessions=ns.sessions,
        seconds=ns.seconds,
        kill_every_s=ns.kill_every,
        disconnect_p=ns.disconnect_p,
        chunk_faults=ns.chunk_faults,
        drop_every=ns.drop_every,
        duplicate_every=ns.duplicate_every,
        seed=ns.seed,
    )
    try:
        config.check()
        spec = prepared(ns.preset, ns.cache_dir, ns.seed)
        return run(run_chaos_bench(spec, config, label=str(ns.preset), progress=ns.progress))
    except (OmniError, ValueError) as exc:
        raise SystemExit(f"omni-actors bench chaos: {exc}") from None


def chaos_table(result: dict[str, Any]) -> list[str]:
    """What the faults cost, in a few lines."""
    met = result["met"]
    return [
        f"{len(result['kills'])} kills, restarts {result['restarts']}; "
        f"{result['turns_started']} turns: {result['turns']}",
        f"conversations {result['conversations']}, lost {result['conversations_lost']} "
        f"(target 0: {met['conversations_lost']}); hung {result['hung']} "
        f"(target 0: {met['hung']})",
        f"recovery after a kill: p50 {result['recovery_s_p50']} s, max "
        f"{result['recovery_s_max']} s",
        f"left at the end vs the start: {result['leaked']} (target none: {met['leaked']})",
    ]
