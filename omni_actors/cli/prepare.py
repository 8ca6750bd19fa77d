"""``omni-actors prepare MODEL``: build a model family's weights into the cache."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omni_actors.cli.progress import ProgressBar
from omni_actors.errors import OmniError
from omni_actors.model_cache import default_cache_dir, is_prepared, prepare
from omni_actors.model_family import model_families

__all__ = ["add_prepare_arguments", "prepare_command"]


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``prepare``."""
    parser.add_argument("model", choices=sorted(model_families()), help="the model family to build")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"where weights live (default: {default_cache_dir()}; env OMNI_ACTORS_CACHE)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--force", action="store_true", help="rebuild even if prepared")


def prepare_command(ns: argparse.Namespace) -> int:
    """Build the weights (with a progress bar) unless they are already there."""
    if not ns.force and is_prepared(ns.model, cache_dir=ns.cache_dir, seed=ns.seed):
        where = prepare(ns.model, cache_dir=ns.cache_dir, seed=ns.seed)
        print(f"{ns.model} (seed {ns.seed}) is already prepared in {where}")
        return 0
    try:
        where = prepare(
            ns.model,
            cache_dir=ns.cache_dir,
            seed=ns.seed,
            force=ns.force,
            progress=ProgressBar(f"preparing {ns.model}", stream=sys.stderr),
        )
    except OmniError as exc:  # e.g. a missing extra: a step for the user, not a traceback
        print(f"omni-actors prepare: {exc}", file=sys.stderr)
        return 2
    print(f"{ns.model} (seed {ns.seed}) prepared in {where}")
    return 0
