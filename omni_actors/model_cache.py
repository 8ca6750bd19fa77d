"""Where prepared model weights live, and preparing them once.

``omni-actors prepare tiny-omni`` draws the tiny-omni weights (seeded, deterministic) into
the cache; every later run loads them from there. Preparing is idempotent — a finished
directory carries a ``prepared.json`` manifest written last, so an interrupted prepare
is simply redone — and concurrent prepares of the same model wait for each other on a
file lock instead of racing.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omni_actors.errors import OmniError

__all__ = [
    "FAMILIES",
    "ModelNotPreparedError",
    "UnknownModelError",
    "default_cache_dir",
    "is_prepared",
    "model_dir",
    "prepare",
]

FAMILIES: dict[str, str] = {"tiny-omni": "omni_actors.actors.tiny_omni.weights"}
"""Model families ``prepare`` can build, and the module whose ``build`` draws them."""

_MANIFEST = "prepared.json"
_FORMAT = 2  # bumped when the layout of a prepared directory changes

Progress = Callable[[str, int, int], None]


class UnknownModelError(OmniError, ValueError):
    """No model family by that name."""


class ModelNotPreparedError(OmniError):
    """The weights a pipeline needs are not in the cache; the message gives the command."""


def default_cache_dir() -> Path:
    """``$OMNI_ACTORS_CACHE``, else ``$XDG_CACHE_HOME/omni-actors``, else ``~/.cache/...``."""
    explicit = os.environ.get("OMNI_ACTORS_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "omni-actors"


def _family(name: str) -> str:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnknownModelError(
            f"no model family {name!r}; known: {', '.join(sorted(FAMILIES))}"
        ) from None


def model_dir(name: str, *, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """The directory of ``name``'s weights drawn with ``seed``."""
    _family(name)
    return (cache_dir or default_cache_dir()) / name / f"seed-{seed}"


def is_prepared(name: str, *, cache_dir: Path | None = None, seed: int = 0) -> bool:
    """Whether ``prepare`` has finished for this model, seed and cache."""
    manifest = model_dir(name, cache_dir=cache_dir, seed=seed) / _MANIFEST
    try:
        data: Any = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == _FORMAT and data.get("seed") == seed


def require(name: str, *, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """The prepared directory, or :class:`ModelNotPreparedError` naming the command."""
    where = model_dir(name, cache_dir=cache_dir, seed=seed)
    if not is_prepared(name, cache_dir=cache_dir, seed=seed):
        flags = f" --seed {seed}" if seed else ""
        if cache_dir is not None:
            flags += f" --cache-dir {cache_dir}"
        raise ModelNotPreparedError(
            f"{name} weights are not prepared in {where}; run: omni-actors prepare {name}{flags}"
        )
    return where


def prepare(
    name: str,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    force: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Build ``name``'s weights into the cache unless they are there; return the directory.

    Args:
        name: a model family (see :data:`FAMILIES`).
        cache_dir: the cache root (default :func:`default_cache_dir`).
        seed: seeds the random weights.
        force: rebuild even if prepared.
        progress: ``progress(step, done, total)`` as each part is written.
    """
    module = _family(name)
    where = model_dir(name, cache_dir=cache_dir, seed=seed)
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f".seed-{seed}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another prepare of the same model waits here
        if not force and is_prepared(name, cache_dir=cache_dir, seed=seed):
            return where
        (where / _MANIFEST).unlink(missing_ok=True)
        build = importlib.import_module(module).build
        build(where, seed, progress)
        manifest = {"format": _FORMAT, "name": name, "seed": seed}
        (where / _MANIFEST).write_text(json.dumps(manifest) + "\n")
    return where
