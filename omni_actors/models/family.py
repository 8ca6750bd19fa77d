"""Model families: a model's engines and the step that prepares its weights, in one place.

A family (``tiny-omni`` today; vLLM models and real Qwen3-Omni checkpoints later) is one
:class:`ModelFamily` object, registered under the entry point group
``omni_actors.families``::

    [project.entry-points."omni_actors.families"]
    tiny-omni = "omni_actors.actors.engines.qwen3_omni.family:TINY_OMNI"

It names its engine kinds (each an importable engine class, loaded only when a pipeline
uses it) and how to prepare its weights into the cache. Its engines take the arguments
of :class:`WeightsArgs`, which is how ``omni-actors run`` points every stage of a family
at one cache and seed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from omni_actors.errors import OmniError

__all__ = [
    "FAMILY_ENTRY_POINTS",
    "ModelFamily",
    "Progress",
    "UnknownModelError",
    "WeightsArgs",
    "family_of_engine",
    "family_of_kind",
    "model_families",
    "model_family",
]

FAMILY_ENTRY_POINTS = "omni_actors.families"

Progress = Callable[[str, int, int], None]
"""``progress(step, done, total)``: called as each part of the weights is written."""


class UnknownModelError(OmniError, ValueError):
    """No model family by that name."""


class WeightsArgs(BaseModel):
    """The arguments every engine of a family takes: which prepared weights it loads.

    Attributes:
        model: a release directory, a Hugging Face repo id or a family's name; None: the
            engine's own family, prepared with ``seed`` in ``cache_dir``.
        seed: the seed the weights were prepared with.
        cache_dir: the cache root (default: ``omni_actors.models.cache.default_cache_dir``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    seed: int = 0
    cache_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class ModelFamily:
    """A model family: its name, its engines and how its weights are prepared.

    Attributes:
        name: the family's name (``omni-actors prepare NAME``, the cache directory).
        engines: engine kind -> ``"package.module:Class"``, imported when a pipeline
            uses that kind (a family's engines may import heavy model code).
        prepare: ``prepare(out_dir, seed, progress)`` writes the weights into
            ``out_dir``; the cache calls it once per seed, under a lock. None: a family
            of engines only, whose weights come from elsewhere (``model:``).
        checkpoint: the subdirectory of ``out_dir`` that holds the whole model as one
            Hugging Face checkpoint (what an engine that loads a model by path, such as
            the ``vllm`` kind, is pointed at by ``model: <family name>``); None if none.
        verify: ``verify(out_dir)`` checks a prepared directory's files without loading
            a model, raising :class:`~omni_actors.errors.ModelFileError` for the first
            missing or corrupt one; the cache runs it before handing the directory out
            (a cache on disk can be truncated or tampered with after it was prepared).
            None: nothing is checked.
        default_model: the family whose prepared weights this family's engines load
            when their ``model`` argument names none.
    """

    name: str
    engines: Mapping[str, str]
    prepare: Callable[[Path, int, Progress | None], None] | None = None
    checkpoint: str | None = None
    verify: Callable[[Path], None] | None = None
    default_model: str | None = None


@functools.cache
def model_families() -> dict[str, ModelFamily]:
    """Every installed family by name (entry point group ``omni_actors.families``).

    Raises:
        UnknownModelError: an entry point does not name a :class:`ModelFamily` (the
            message names the package to fix).
    """
    found: dict[str, ModelFamily] = {}
    for point in entry_points(group=FAMILY_ENTRY_POINTS):
        family = point.load()
        if not isinstance(family, ModelFamily) or family.name != point.name:
            raise UnknownModelError(
                f"entry point {point.name} = {point.value} (group {FAMILY_ENTRY_POINTS}) must "
                f"name a ModelFamily called {point.name!r}, got {family!r}"
            )
        found[point.name] = family
    return found


def model_family(name: str) -> ModelFamily:
    """The family called ``name``.

    Raises:
        UnknownModelError: no such family (the message lists the known ones).
    """
    families = model_families()
    try:
        return families[name]
    except KeyError:
        known = ", ".join(sorted(families)) or "none installed"
        raise UnknownModelError(f"no model family {name!r}; known: {known}") from None


def family_of_kind(kind: str) -> ModelFamily | None:
    """The family that provides engine ``kind``, if one does."""
    for family in model_families().values():
        if kind in family.engines:
            return family
    return None


def family_of_engine(kind: str, args: Mapping[str, object]) -> ModelFamily | None:
    """The family whose prepared weights an engine loads, if it loads a family's: the
    one its ``model`` argument names, or, without one, its kind's family's default
    (None for a model named by path or repo id, which is not prepared here)."""
    model = args.get("model")
    if model is None:
        family = family_of_kind(kind)
        model = family.default_model if family is not None else None
    found = model_families().get(model) if isinstance(model, str) else None
    return found if found is not None and found.prepare is not None else None
