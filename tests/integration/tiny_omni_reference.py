"""HF's end-to-end tiny-omni model as the reference of a conversation.

``Qwen3OmniMoeForConditionalGeneration.generate`` with the prepared tiny weights, run on
a whole conversation as one request, made to follow our engines' choices (printable
bytes, the same reply length); its talker's codes are recorded where it hands them to
code2wav. Shared by the engine-level and the pipeline-level conversation tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tiny_omni_ids import (
    ASSISTANT_OPENING,
    NEWLINE,
    PRINTABLE,
    Tokens,
    encode,
    feature_extractor,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeForConditionalGeneration,
)

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.qwen3_omni import configs, stepping


def reference_model(cache_dir: Path) -> Any:
    """HF's end-to-end model with the tiny weights; ``captured`` gets each reply's codes."""
    root = cache_dir / "tiny-omni" / "seed-0"
    # transformers' own loader, on the release the engines load: the reference shares
    # no loading code with them.
    with configs.quiet_transformers():
        model: Any = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
            root, use_safetensors=True, local_files_only=True, dtype=torch.float32
        ).eval()
    # HF hands the talker's codes to code2wav only: record them there.
    captured: list[torch.Tensor] = []
    decode = model.code2wav.chunked_decode

    def recorded(codes: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        captured.append(codes.clone())
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = recorded
    model.captured = captured
    return model


def audio_clip(seconds: float = 1.0) -> torch.Tensor:
    t = torch.arange(int(configs.AUDIO_SAMPLE_RATE * seconds)) / configs.AUDIO_SAMPLE_RATE
    return (0.3 * torch.sin(2 * math.pi * 440.0 * t)).to(torch.float32)


def hf_user_turn(user: Fields, n_window: int) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The ids of ``user``'s turn in HF's prompt, and its audio features if it has audio
    (computed as the thinker engine computes them)."""
    ids: list[int] = [Tokens.IM_START, Tokens.USER, NEWLINE]
    features: dict[str, torch.Tensor] = {}
    audio = user.get("audio")
    if isinstance(audio, torch.Tensor):
        extracted = feature_extractor()(
            audio.numpy(),
            sampling_rate=configs.AUDIO_SAMPLE_RATE,
            padding="longest",
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
        )
        mask = extracted["attention_mask"]
        n = stepping.audio_token_count(int(mask.sum()), n_window)
        ids += [Tokens.AUDIO_START, *[Tokens.AUDIO_PAD] * n, Tokens.AUDIO_END]
        features = {"input_features": extracted["input_features"], "feature_attention_mask": mask}
    text = user.get("text")
    if isinstance(text, str):
        ids += encode(text)
    return [*ids, Tokens.IM_END, NEWLINE], features


def hf_reply(
    reference: Any, prompt: list[int], replied: int, frames: int, min_tokens: int, **audio: Any
) -> Any:
    """HF's greedy generate on ``prompt``, made to follow our engines' choices.

    The thinker may only pick printable bytes, and ``<|im_end|>`` only from the
    ``min_tokens``-th token on, as ours; ``<|im_end|>`` is forced after ``replied``
    tokens (ours stop at ``max_new_tokens``, which also feeds their last token to the
    talker, where HF's talker would otherwise drop an unfed last token). Codec EOS is
    suppressed as our talker's default does, and HF's talker makes one frame less than
    its ``max_new_tokens`` (the last step's residual codes are never predicted).
    """
    text_vocab = reference.config.thinker_config.text_config.vocab_size
    talker_vocab = reference.config.talker_config.text_config.vocab_size
    allowed = {*PRINTABLE, Tokens.IM_END}
    return reference.generate(
        torch.tensor([prompt]),
        speaker="ethan",
        thinker_max_new_tokens=replied + 1,
        thinker_eos_token_id=Tokens.IM_END,
        thinker_forced_eos_token_id=Tokens.IM_END,
        thinker_min_new_tokens=min_tokens,
        thinker_suppress_tokens=[i for i in range(text_vocab) if i not in allowed],
        talker_max_new_tokens=frames + 1,
        talker_do_sample=False,
        talker_repetition_penalty=1.0,
        talker_suppress_tokens=list(range(talker_vocab - 1024, talker_vocab)),
        **audio,
    )


def assistant_turn(ids: Sequence[int]) -> list[int]:
    return [*ASSISTANT_OPENING, *ids, Tokens.IM_END, NEWLINE]
