"""``omni-actors prepare MODEL``: build a model family's weights into the cache."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omni_actors.cli.progress import ProgressBar
from omni_actors.errors import OmniError
from omni_actors.models.cache import default_cache_dir, is_prepared, prepare
from omni_actors.models.cache import prepare as _prepare
from omni_actors.models.family import model_families, model_family
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline

__all__ = ["NotPreparedError", "add_prepare_arguments", "prepare_command", "prepared_spec"]


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``prepare``."""
    parser.add_argument(
        "model",
        choices=sorted(name for name, family in model_families().items() if family.prepare),
        help="the release to write",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"where weights live (default: {default_cache_dir()}; env OMNI_ACTORS_CACHE)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the release into this directory instead of the cache (replaced; name it "
        "as model: DIR or --model DIR)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if prepared")


def prepare_command(ns: argparse.Namespace) -> int:
    """Build the weights (with a progress bar) unless they are already there."""
    # A missing extra, or a prepared file found damaged: a step for the user, not a traceback.
    try:
        if ns.out is not None:
            return _prepare_out(ns)
        if not ns.force and is_prepared(ns.model, cache_dir=ns.cache_dir, seed=ns.seed):
            where = prepare(ns.model, cache_dir=ns.cache_dir, seed=ns.seed)
            print(f"{ns.model} (seed {ns.seed}) is already prepared in {where}")
            return 0
        where = prepare(
            ns.model,
            cache_dir=ns.cache_dir,
            seed=ns.seed,
            force=ns.force,
            progress=ProgressBar(f"preparing {ns.model}", stream=sys.stderr),
        )
    except OmniError as exc:
        print(f"omni-actors prepare: {exc}", file=sys.stderr)
        return 2
    print(f"{ns.model} (seed {ns.seed}) prepared in {where}")
    return 0


def _prepare_out(ns: argparse.Namespace) -> int:
    """Write the release into ``--out``, then check it as the cache checks its own."""
    family = model_family(ns.model)
    assert family.prepare is not None  # the argument's choices
    family.prepare(ns.out, ns.seed, ProgressBar(f"preparing {ns.model}", stream=sys.stderr))
    if family.verify is not None:
        family.verify(ns.out)
    print(f"{ns.model} (seed {ns.seed}) written to {ns.out}")
    return 0


class NotPreparedError(OmniError):
    """A pipeline's weights are missing and preparing them was not allowed."""


def prepared_spec(
    pipeline: PipelineSpec | str | Path,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    prepare: bool = True,
) -> PipelineSpec:
    """The pipeline with its model-family stages pointed at the cache and seed, their
    weights prepared first (with a progress bar on stderr) if missing.

    Raises:
        NotPreparedError: weights are missing and ``prepare`` is False (the message
            gives the command to run).
        OmniError: the pipeline cannot be loaded.
    """
    spec = pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline)
    families = spec.model_families()
    for model, family in sorted(families.items()):
        if is_prepared(family, cache_dir=cache_dir, seed=seed):
            continue
        if not prepare:
            flags = f" --seed {seed}" if seed else ""
            flags += f" --cache-dir {cache_dir}" if cache_dir else ""
            raise NotPreparedError(
                f"{model} weights are not prepared; run: omni-actors prepare {model}{flags}"
            )
        _prepare(
            family,
            cache_dir=cache_dir,
            seed=seed,
            progress=ProgressBar(f"preparing {model}", stream=sys.stderr),
        )
    return spec.with_weights(cache_dir=cache_dir, seed=seed) if families else spec
