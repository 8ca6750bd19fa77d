"""tiny-omni as one Hugging Face checkpoint, the layout a real Qwen3-Omni release has.

The engines load one directory per stage (``thinker/``, ``talker/``, ``code2wav/``); an
engine that loads a model by path (vLLM) expects what Qwen publishes instead: the
composite ``Qwen3OmniMoeForConditionalGeneration`` config, every stage's tensors under
its prefix (``thinker.``, ``talker.``, ``code2wav.``), the tokenizer and the processor
config. :func:`write_checkpoint` assembles that from the stage directories (the same
tensors, so a vLLM thinker and the torch one run the same weights).

Fields vLLM reads that transformers' config classes do not write are added here: the
vision tower's ``image_size`` (16-pixel patches, 8 by 8: its 64 position embeddings)
and ``apply_vit_abs_pos_embed`` (vLLM builds the tower though text and audio never run
it), and an untied language-model head (tiny-omni's is a separate tensor).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Final

from safetensors.torch import load_file, save_file

from .configs import audio_feature_extractor

__all__ = ["ARCHITECTURE", "write_checkpoint"]

ARCHITECTURE: Final = "Qwen3OmniMoeForConditionalGeneration"
_STAGES: Final = ("thinker", "talker", "code2wav")
_TOKENIZER_FILES: Final = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _processor_config() -> dict[str, Any]:
    """The ``Qwen3OmniMoeProcessor`` config: the Whisper front end tiny-omni uses, and
    the image and video processors by type (their defaults; tiny-omni takes no images)."""
    features = audio_feature_extractor().to_dict()
    features.pop("processor_class", None)
    return {
        "processor_class": "Qwen3OmniMoeProcessor",
        "feature_extractor": features,
        "image_processor": {"image_processor_type": "Qwen2VLImageProcessor"},
        "video_processor": {"video_processor_type": "Qwen2VLVideoProcessor"},
    }


def write_checkpoint(model_dir: Path, out: Path) -> None:
    """Write the single checkpoint of the tiny-omni in ``model_dir`` into ``out``.

    ``model_dir`` holds the stage directories, the composite ``config.json`` and the
    tokenizer (as :func:`.weights.build` leaves them); ``out`` is replaced.
    """
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = [ARCHITECTURE]
    thinker = config["thinker_config"]
    thinker["vision_config"].update(image_size=128, apply_vit_abs_pos_embed=True)
    thinker["text_config"]["tie_word_embeddings"] = False
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tensors = {
        f"{stage}.{name}": tensor
        for stage in _STAGES
        for name, tensor in load_file(model_dir / stage / "model.safetensors").items()
    }
    save_file(tensors, staging / "model.safetensors", metadata={"format": "pt"})
    for name in _TOKENIZER_FILES:
        shutil.copy(model_dir / name, staging / name)
    processor = json.dumps(_processor_config(), indent=2, sort_keys=True)
    (staging / "processor_config.json").write_text(processor)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
