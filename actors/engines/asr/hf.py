"""Every ``transformers`` name the transcriber uses, imported in one place.

A missing ``transformers`` fails here with a :class:`MissingExtraError` naming the
extra, whichever module reached it first; and the surface depended on reads in one
screen (public names only).
"""

from __future__ import annotations

import logging
import re

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


class _WhisperOwnArguments(logging.Filter):
    """Drops transformers' deprecation note on a ``generate`` call given both a
    ``generation_config`` and the suppress-token arguments: Whisper's own ``generate``
    makes that call on every transcript (transformers 5.x), whatever its caller passes,
    so the note is about transformers' code and nothing a user can change. The note
    about any other argument still shows."""

    _NOTE = re.compile(
        r"Passing `generation_config` together with generation-related arguments=\(\{(.*?)\}\)"
    )
    _WHISPERS = frozenset({"suppress_tokens", "begin_suppress_tokens"})

    def filter(self, record: logging.LogRecord) -> bool:
        note = self._NOTE.match(record.getMessage())
        return note is None or not set(re.findall(r"'(\w+)'", note[1])) <= self._WHISPERS


logging.getLogger("transformers.generation.utils").addFilter(_WhisperOwnArguments())

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
