"""Every ``transformers`` name the cascade's engines use, imported in one place.

A missing ``transformers`` fails here with a :class:`MissingExtraError` naming the
extra, whichever module reached it first.
"""

from __future__ import annotations

import logging
import re
import sys

from omni_actors.errors import MissingExtraError

try:
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        CsmConfig,
        CsmDepthDecoderConfig,
        CsmForConditionalGeneration,
        DynamicCache,
        GenerationConfig,
        MimiConfig,
        MimiModel,
        Qwen3Config,
        Qwen3ForCausalLM,
    )
except ImportError as exc:
    raise MissingExtraError("the speech cascade", "tiny-omni", exc) from exc


class _CsmTextIds(logging.Filter):
    """Drops transformers' warning that CSM's text token ids lie outside its vocabulary:
    ``CsmConfig`` checks its text ids (``bos``, ``pad``, ``audio`` and ``audio_eos``,
    ids of the text tokenizer) against its codebook vocabulary, so every CSM config,
    ``sesame/csm-1b``'s too, draws it four times. Any other config's warning still
    shows."""

    _NOTE = re.compile(r"Model config: (bos|pad|audio|audio_eos)_token_id must be `None`")

    def filter(self, record: logging.LogRecord) -> bool:
        if self._NOTE.match(record.getMessage()) is None:
            return True
        # Only a CSM config's check: the config being checked is the caller's ``self``.
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "validate_token_ids":
            frame = frame.f_back  # type: ignore[assignment]
        config = None if frame is None else frame.f_locals.get("self")
        return getattr(config, "model_type", None) != "csm"


logging.getLogger("transformers.configuration_utils").addFilter(_CsmTextIds())

__all__ = [
    "AutoConfig",
    "AutoModelForCausalLM",
    "AutoTokenizer",
    "CsmConfig",
    "CsmDepthDecoderConfig",
    "CsmForConditionalGeneration",
    "DynamicCache",
    "GenerationConfig",
    "MimiConfig",
    "MimiModel",
    "Qwen3Config",
    "Qwen3ForCausalLM",
]
