"""``omni-actors bench pipeline --cluster``: the cross-node hop bench from the command
line (the options are ``bench pipeline``'s; :mod:`omni_actors.bench.cluster` measures)."""

from __future__ import annotations

import argparse
from typing import Any

from omni_actors import run
from omni_actors.errors import OmniError

__all__ = ["bench_cluster"]


def bench_cluster(ns: argparse.Namespace) -> dict[str, Any]:
    """Run the bench for ``--preset`` (default ``scripted-omni``) on ``--cluster``; a
    bad preset, a missing Ray or a cluster without room ends the command with why."""
    from omni_actors.bench.cluster import run_cluster_bench

    try:
        return run(
            run_cluster_bench(
                ns.preset or "scripted-omni",
                ns.cluster,
                # One level, concurrency 1: K requests per level are K requests.
                ns.requests if ns.requests_per_level is None else ns.requests_per_level,
                cache_dir=ns.cache_dir,
                seed=ns.seed,
                reply_tokens=ns.output_tokens,
            )
        )
    except (OmniError, ValueError, ImportError, TimeoutError) as exc:
        raise SystemExit(f"omni-actors bench pipeline: {exc}") from None
