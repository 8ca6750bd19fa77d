"""Every ``transformers`` name tiny-omni uses, imported in one place.

One place for two reasons. A missing ``transformers`` (``pip install omni-actors``
without the ``tiny-omni`` extra) fails here with a :class:`MissingExtraError` that names
the extra, whichever tiny-omni module the caller reached first. And the surface we depend
on can be reviewed in one screen against the supported range (docs/installing.md,
"Supported versions"): public names only, never one starting with ``_``, which transformers may
rename in any release.

Some classes below are public by name but not in their module's ``__all__``:
``Qwen3OmniMoeCode2WavConfig`` (code2wav's own config: tiny-omni builds and loads that
stage on its own), and building blocks tiny-omni adjusts or inspects rather than only
calls: ``Qwen3OmniMoeTalkerTextExperts`` and ``Qwen3OmniMoeTalkerTextTopKRouter``
(initialized by ``weights``), ``Qwen3OmniMoeThinkerTextExperts`` and the talker's
experts (swapped by ``moe``, whose tests compare their output with theirs),
``Qwen3OmniMoeCausalTransConvNet`` (its tail trim turned off by ``code2wav_model``), and
the decoder layers ``code2wav_reach`` measures. Each use checks the model afterwards
(finite weights; the decoded prefix unchanged; the emitted samples unchanged), so a
release that changes them fails loudly, not silently.
"""

from __future__ import annotations

import logging

from omni_actors.errors import MissingExtraError

try:
    from transformers import (
        AttentionInterface,
        DynamicCache,
        PreTrainedConfig,
        PreTrainedModel,
        WhisperFeatureExtractor,
    )
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
        Qwen3OmniMoeConfig,
        Qwen3OmniMoeTalkerConfig,
        Qwen3OmniMoeThinkerConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeCausalConvNet,
        Qwen3OmniMoeCausalTransConvNet,
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeCode2WavDecoderBlock,
        Qwen3OmniMoeCode2WavDecoderResidualUnit,
        Qwen3OmniMoeSnakeBeta,
        Qwen3OmniMoeTalkerForConditionalGeneration,
        Qwen3OmniMoeTalkerTextExperts,
        Qwen3OmniMoeTalkerTextTopKRouter,
        Qwen3OmniMoeThinkerForConditionalGeneration,
        Qwen3OmniMoeThinkerTextExperts,
    )
    from transformers.utils import logging as hf_logging
except ImportError as exc:
    raise MissingExtraError("tiny-omni", "tiny-omni", exc) from exc

# Qwen3-Omni's own config carries mrope keys that transformers' rope validation does not
# list, so every release (the published one too) would warn on every start: the model's
# configuration, not the user's, and nothing they can act on.
logging.getLogger("transformers.modeling_rope_utils").setLevel(logging.ERROR)

__all__ = [
    "AttentionInterface",
    "DynamicCache",
    "PreTrainedConfig",
    "PreTrainedModel",
    "Qwen3OmniMoeCausalConvNet",
    "Qwen3OmniMoeCausalTransConvNet",
    "Qwen3OmniMoeCode2Wav",
    "Qwen3OmniMoeCode2WavConfig",
    "Qwen3OmniMoeCode2WavDecoderBlock",
    "Qwen3OmniMoeCode2WavDecoderResidualUnit",
    "Qwen3OmniMoeConfig",
    "Qwen3OmniMoeSnakeBeta",
    "Qwen3OmniMoeTalkerConfig",
    "Qwen3OmniMoeTalkerForConditionalGeneration",
    "Qwen3OmniMoeTalkerTextExperts",
    "Qwen3OmniMoeTalkerTextTopKRouter",
    "Qwen3OmniMoeThinkerConfig",
    "Qwen3OmniMoeThinkerForConditionalGeneration",
    "Qwen3OmniMoeThinkerTextExperts",
    "WhisperFeatureExtractor",
    "hf_logging",
]
