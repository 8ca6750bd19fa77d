"""``omni-actors bench rollback``'s command line: its options and the run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omni_actors.bench.cli_args import positive_int
from omni_actors.errors import OmniError

__all__ = ["add_rollback_options", "bench_rollback"]


def add_rollback_options(parser: argparse.ArgumentParser) -> None:
    """``bench rollback``'s options."""
    parser.add_argument("--preset", default="tiny-omni-vllm", help="preset name or YAML path")
    parser.add_argument(
        "--turns", type=positive_int, default=6, help="user turns before the measured one (6)"
    )
    parser.add_argument(
        "--turn-chars", type=positive_int, default=200, help="characters per user turn (200)"
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=5, help="sessions per kind of rollback (5)"
    )
    parser.add_argument(
        "--reply-tokens", type=positive_int, default=8, help="every reply's tokens (8)"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="the weights cache")
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed (0)")


def bench_rollback(ns: argparse.Namespace) -> dict[str, Any]:
    """Run ``bench rollback`` for the CLI: a bad option, preset or reply exits with why."""
    from omni_actors import run
    from omni_actors.bench.rollback import run_rollback_bench

    try:
        return run(
            run_rollback_bench(
                ns.preset,
                turns=ns.turns,
                turn_chars=ns.turn_chars,
                repeat=ns.repeat,
                reply_tokens=ns.reply_tokens,
                cache_dir=ns.cache_dir,
                seed=ns.seed,
            )
        )
    except (OmniError, ValueError) as exc:  # a bad option or preset, a failed reply
        raise SystemExit(f"omni-actors bench rollback: {exc}") from None
