"""Every ``transformers`` name the cascade's engines use, imported in one place.

A missing ``transformers`` fails here with a :class:`MissingExtraError` naming the
extra, whichever module reached it first.
"""

from __future__ import annotations

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
