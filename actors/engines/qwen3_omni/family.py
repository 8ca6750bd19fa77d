"""The ``qwen3-omni`` model family, and the releases it can prepare without a download.

Registered under the entry point group ``omni_actors.families`` (see ``pyproject.toml``):

- ``qwen3-omni``: the three engines, which load any release of Qwen3-Omni, whatever its
  size (``model:`` a release directory, a Hub repo id, or one of the two below). Its
  engines load ``tiny-omni`` when no ``model`` is given.
- ``tiny-omni``: a release written here in the published layout, with tiny, seeded
  random weights small enough for a 2-core CPU (``omni-actors prepare tiny-omni``).
- ``qwen3-omni-random``: ``Qwen/Qwen3-Omni-30B-A3B-Instruct``'s layout at full size,
  with seeded random weights (66 GiB; drawn on the GPU when there is one), for GPU tests
  and benches where nothing can be downloaded.

This module imports nothing heavy: an engine's module (which loads transformers) is
imported only when a pipeline names its kind, and the weights code only to prepare;
checking a prepared directory (:func:`.layout.verify`) needs neither.
"""

from __future__ import annotations

from pathlib import Path

from omni_actors.models.family import ModelFamily, Progress

from .layout import verify

__all__ = ["DEFAULT_RELEASE", "QWEN3_OMNI", "QWEN3_OMNI_RANDOM", "TINY_OMNI"]

DEFAULT_RELEASE = "tiny-omni"
"""The release the engines load when their ``model`` argument names none."""

_ENGINES = "omni_actors.actors.engines.qwen3_omni"


def _prepare_tiny(out_dir: Path, seed: int, progress: Progress | None) -> None:
    from omni_actors.actors.engines.qwen3_omni.weights import build

    build(out_dir, seed, progress)


def _prepare_random(out_dir: Path, seed: int, progress: Progress | None) -> None:
    from omni_actors.actors.engines.qwen3_omni.random_release import (
        real_config,
        write_random_release,
    )

    write_random_release(out_dir, real_config(), seed=seed, progress=progress)


QWEN3_OMNI = ModelFamily(
    name="qwen3-omni",
    engines={
        f"qwen3-omni.{stage}": f"{_ENGINES}.{stage}_engine:{name}Engine"
        for stage, name in (("thinker", "Thinker"), ("talker", "Talker"), ("code2wav", "Code2Wav"))
    },
    default_model=DEFAULT_RELEASE,
)
"""Qwen3-Omni's engines: any release, any size."""

TINY_OMNI = ModelFamily(
    name="tiny-omni",
    engines={},
    prepare=_prepare_tiny,
    checkpoint=".",  # the prepared directory is the release (`model: tiny-omni`)
    verify=verify,
)
"""Qwen3-Omni's architecture at toy size, with seeded random weights (no download)."""

QWEN3_OMNI_RANDOM = ModelFamily(
    name="qwen3-omni-random",
    engines={},
    prepare=_prepare_random,
    checkpoint=".",
    verify=verify,
)
"""Qwen3-Omni-30B-A3B-Instruct's release at full size, with seeded random weights."""
