"""The speech-recognition families: the ``transformers.asr`` engine, and a tiny Whisper.

Registered under the entry point group ``omni_actors.families`` (see ``pyproject.toml``):

- ``transformers-asr``: the engine kind ``transformers.asr``, which loads any
  transformers speech-to-text checkpoint (``model:`` a directory or a Hub repo id, such
  as ``openai/whisper-large-v3``); it loads ``tiny-whisper`` when no ``model`` is given.
- ``tiny-whisper``: Whisper's architecture at toy size with seeded random weights,
  written locally (``omni-actors prepare tiny-whisper``; ``serve`` prepares it for a
  pipeline that uses it). Its transcripts are random printable text by construction.

This module imports nothing heavy.
"""

from __future__ import annotations

from pathlib import Path

from omni_actors.models.family import ModelFamily, Progress

__all__ = ["DEFAULT_TRANSCRIBER", "TINY_WHISPER", "TRANSFORMERS_ASR"]

DEFAULT_TRANSCRIBER = "tiny-whisper"
"""The checkpoint the engine loads when its ``model`` argument names none."""


def _prepare_tiny(out_dir: Path, seed: int, progress: Progress | None) -> None:
    from omni_actors.actors.engines.asr.tiny_whisper import write_tiny_whisper

    write_tiny_whisper(out_dir, seed, progress)


def _verify(out_dir: Path) -> None:
    from omni_actors.actors.engines.asr.tiny_whisper import verify

    verify(out_dir)


TRANSFORMERS_ASR = ModelFamily(
    name="transformers-asr",
    engines={"transformers.asr": "omni_actors.actors.engines.asr.engine:AsrEngine"},
    default_model=DEFAULT_TRANSCRIBER,
)
"""The transcriber engine: any transformers speech-to-text checkpoint."""

TINY_WHISPER = ModelFamily(
    name="tiny-whisper",
    engines={},
    prepare=_prepare_tiny,
    checkpoint=".",  # the prepared directory is the checkpoint (`model: tiny-whisper`)
    verify=_verify,
)
"""Whisper at toy size, with seeded random weights (no download)."""
