"""The ``tiny-omni`` model family: its three engines and how its weights are prepared.

Registered under the entry point group ``omni_actors.families`` (see ``pyproject.toml``).
This module imports nothing heavy: an engine's module (which loads transformers) is
imported only when a pipeline names its kind, and the weights code only to prepare;
checking a prepared directory (:func:`.layout.verify`) needs neither.
"""

from __future__ import annotations

from pathlib import Path

from omni_actors.models.family import ModelFamily, Progress

from .layout import verify

__all__ = ["TINY_OMNI"]


def _prepare(out_dir: Path, seed: int, progress: Progress | None) -> None:
    from omni_actors.actors.engines.tiny_omni.weights import build

    build(out_dir, seed, progress)


TINY_OMNI = ModelFamily(
    name="tiny-omni",
    engines={
        "tiny-omni.thinker": "omni_actors.actors.engines.tiny_omni.thinker_engine:ThinkerEngine",
        "tiny-omni.talker": "omni_actors.actors.engines.tiny_omni.talker_engine:TalkerEngine",
        "tiny-omni.code2wav": "omni_actors.actors.engines.tiny_omni.code2wav_engine:Code2WavEngine",
    },
    prepare=_prepare,
    checkpoint="checkpoint",  # layout.CHECKPOINT: what `vllm` stages load (model: tiny-omni)
    verify=verify,
)
"""Qwen3-Omni's architecture at toy size, with seeded random weights (no download)."""
