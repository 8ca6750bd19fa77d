"""Where prepared model weights live, and preparing them once.

``omni-actors prepare tiny-omni`` has the ``tiny-omni`` family (see
:mod:`omni_actors.models.family`) draw its weights (seeded, deterministic) into the
cache; every later run loads them from there. Preparing is idempotent — a finished
directory carries a ``prepared.json`` manifest written last, so an interrupted prepare
is simply redone — and concurrent prepares of the same model wait for each other on a
file lock instead of racing.

A prepared directory is handed out (:func:`require`, :func:`prepare`) only once its
family's ``verify`` passes: a file damaged since it was prepared is reported by name,
with the command that rebuilds it, rather than loaded.

The manifest names the format of what was prepared (``_FORMAT``, bumped whenever what
a prepare writes changes: the layout, or a file's content such as a chat template). A
directory prepared by an older version is outdated, not damaged: :func:`require`
prepares it again, as ``prepare`` would have, since its weights are drawn from the seed
alone and come out the same.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

from omni_actors.errors import ModelFileError, OmniError
from omni_actors.models.family import ModelFamily, Progress, model_families, model_family
from omni_actors.models.release import resolve_model

__all__ = [
    "ModelNotPreparedError",
    "default_cache_dir",
    "is_prepared",
    "locate",
    "model_dir",
    "prepare",
    "require",
]

log = logging.getLogger(__name__)

_MANIFEST = "prepared.json"
# Bumped when what a prepare writes changes (6: tiny-omni's chat template renders tools;
# 7: tiny-cascade's LLM has heads of 32, which vLLM's CPU attention takes; 8: tiny-whisper's
# weights are drawn from the seed and each tensor's name, not the global RNG).
_FORMAT = 8


class ModelNotPreparedError(OmniError):
    """The weights a pipeline needs are not in the cache; the message gives the command."""


def default_cache_dir() -> Path:
    """``$OMNI_ACTORS_CACHE``, else ``$XDG_CACHE_HOME/omni-actors``, else ``~/.cache/...``."""
    explicit = os.environ.get("OMNI_ACTORS_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "omni-actors"


def _family(family: str | ModelFamily) -> ModelFamily:
    return family if isinstance(family, ModelFamily) else model_family(family)


def model_dir(family: str | ModelFamily, *, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """The directory of ``family``'s weights drawn with ``seed``.

    Raises:
        UnknownModelError: no family by that name.
    """
    name = _family(family).name
    return (cache_dir or default_cache_dir()) / name / f"seed-{seed}"


def is_prepared(family: str | ModelFamily, *, cache_dir: Path | None = None, seed: int = 0) -> bool:
    """Whether ``prepare`` has finished for this family, seed and cache.

    Reads the manifest only; :func:`require` checks the files too.
    """
    manifest = model_dir(family, cache_dir=cache_dir, seed=seed) / _MANIFEST
    try:
        data: Any = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == _FORMAT and data.get("seed") == seed


def _outdated(where: Path, seed: int) -> bool:
    """Whether ``where`` holds a finished prepare of an older format."""
    try:
        data: Any = json.loads((where / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("seed") != seed:
        return False
    found = data.get("format")
    return isinstance(found, int) and found < _FORMAT


def _prepare_command(name: str, cache_dir: Path | None, seed: int) -> str:
    flags = f" --seed {seed}" if seed else ""
    if cache_dir is not None:
        flags += f" --cache-dir {cache_dir}"
    return f"omni-actors prepare {name}{flags}"


def _verify(family: ModelFamily, where: Path, cache_dir: Path | None, seed: int) -> None:
    """Run the family's ``verify`` on its prepared ``where``; a damaged file's error
    gets the command that rebuilds the directory."""
    if family.verify is None:
        return
    try:
        family.verify(where)
    except ModelFileError as error:
        command = _prepare_command(family.name, cache_dir, seed)
        remedy = f"the prepared model is damaged; rebuild it: {command} --force (or delete {where})"
        raise ModelFileError(error.path, error.problem, remedy) from error


def require(family: str | ModelFamily, *, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """The prepared directory, its files checked by the family's ``verify``; one an
    older version prepared is prepared again first (module docstring).

    Raises:
        ModelNotPreparedError: not prepared (the message names the command).
        ModelFileError: a prepared file is missing or corrupt (the message names the
            file and the command that rebuilds it).
        UnknownModelError: no family by that name.
    """
    found = _family(family)
    where = model_dir(found, cache_dir=cache_dir, seed=seed)
    if (
        not is_prepared(found, cache_dir=cache_dir, seed=seed)
        and found.prepare is not None
        and _outdated(where, seed)
    ):
        log.info("%s in %s was prepared by an older version: preparing it again", found.name, where)
        return prepare(found, cache_dir=cache_dir, seed=seed)
    if not is_prepared(found, cache_dir=cache_dir, seed=seed):
        raise ModelNotPreparedError(
            f"{found.name} weights are not prepared in {where}; "
            f"run: {_prepare_command(found.name, cache_dir, seed)}"
        )
    _verify(found, where, cache_dir, seed)
    return where


def prepare(
    family: str | ModelFamily,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    force: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Build ``family``'s weights into the cache unless they are there; return the directory.

    Args:
        family: a model family, or its name (see :func:`omni_actors.models.family.model_families`).
        cache_dir: the cache root (default :func:`default_cache_dir`).
        seed: seeds the random weights.
        force: rebuild even if prepared.
        progress: ``progress(step, done, total)`` as each part is written.

    Raises:
        ModelFileError: already prepared (and not ``force``), but a file is missing or
            corrupt; the message names it and says to rebuild with ``--force``.
    """
    found = _family(family)
    if found.prepare is None:
        raise ModelNotPreparedError(
            f"{found.name} names engines, not weights to prepare: point its stages at a "
            "release (model: a directory or a Hugging Face repo id), or prepare one of "
            f"{', '.join(sorted(n for n, f in model_families().items() if f.prepare))}"
        )
    where = model_dir(found, cache_dir=cache_dir, seed=seed)
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f".seed-{seed}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another prepare of the same model waits here
        if not force and is_prepared(found, cache_dir=cache_dir, seed=seed):
            # Not rebuilt behind the caller's back: a damaged cache may be a disk failing
            # or a file tampered with, which the user should hear of.
            _verify(found, where, cache_dir, seed)
            return where
        (where / _MANIFEST).unlink(missing_ok=True)
        found.prepare(where, seed, progress)
        manifest = {"format": _FORMAT, "name": found.name, "seed": seed}
        (where / _MANIFEST).write_text(json.dumps(manifest) + "\n")
    return where


def locate(
    model: str,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    prefixes: tuple[str, ...] = (),
) -> Path:
    """The release directory an engine's ``model`` argument names.

    ``model`` is a release directory, a Hugging Face repo id (fetched through the local
    Hub cache first; only the shards holding ``prefixes`` are downloaded), or the name of
    a model family, whose prepared release at ``seed`` in ``cache_dir`` it means.

    Raises:
        ModelNotPreparedError: the family's weights are not prepared.
        ModelFileError: neither a directory, a repo id nor a family that prepares a
            release; a download failed; or a prepared file is damaged.
    """
    named = model_families().get(model)
    if named is None:
        return resolve_model(model, prefixes=prefixes)
    if named.checkpoint is None or named.prepare is None:
        raise ModelFileError(
            Path(model),
            "is a model family of engines, not a release: name a release directory, a "
            "Hugging Face repo id, or a family that prepares one (tiny-omni, "
            "qwen3-omni-random)",
        )
    return require(named, cache_dir=cache_dir, seed=seed) / named.checkpoint
