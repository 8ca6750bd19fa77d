"""Every ``transformers`` name the transcriber uses, imported in one place.

A missing ``transformers`` fails here with a :class:`MissingExtraError` naming the
extra, whichever module reached it first; and the surface depended on reads in one
screen (public names only).
"""

from __future__ import annotations

from omni_actors.errors import MissingExtraError

try:
    from transformers import (
        AutoModelForSpeechSeq2Seq,
        AutoProcessor,
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )
except ImportError as exc:
    raise MissingExtraError("speech recognition", "tiny-omni", exc) from exc

__all__ = [
    "AutoModelForSpeechSeq2Seq",
    "AutoProcessor",
    "GenerationConfig",
    "WhisperConfig",
    "WhisperFeatureExtractor",
    "WhisperForConditionalGeneration",
    "WhisperProcessor",
    "WhisperTokenizer",
]
