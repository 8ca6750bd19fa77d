"""Configurations of tiny-omni, the embedded default model family.

tiny-omni is Qwen3-Omni's real architecture (the ``transformers.models.qwen3_omni_moe``
classes) shrunk until a whole thinker -> talker -> code2wav pipeline runs far faster than
real time on two CPU cores. Every shape that the serving stack relies on is kept: a MoE
thinker with an audio encoder, a MoE talker with a code predictor emitting several
codebooks per frame, and a code2wav decoder producing 1920 samples (80 ms at 24 kHz) per
codec frame. Only widths, depths and vocabularies shrink, so an engine written against
tiny-omni runs the same calls as one serving the real checkpoint.

The text vocabulary is a tiny byte-level BPE (:mod:`.tokenizer`); the special ids written
here are its tokens' ids, which the engines read back from the release, never from here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from omni_actors.actors.engines.qwen3_omni.hf import (
    Qwen3OmniMoeCode2WavConfig,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeTalkerConfig,
    Qwen3OmniMoeThinkerConfig,
    WhisperFeatureExtractor,
    hf_logging,
)
from omni_actors.actors.engines.qwen3_omni.tokenizer import TinyVocab

__all__ = [
    "AUDIO_SAMPLE_RATE",
    "CODEBOOK_SIZE",
    "DEFAULT_NUM_CODE_GROUPS",
    "FRAME_RATE_HZ",
    "OUTPUT_SAMPLE_RATE",
    "SAMPLES_PER_FRAME",
    "audio_feature_extractor",
    "quiet_transformers",
    "tiny_configs",
]

AUDIO_SAMPLE_RATE: Final = 16_000
"""Input audio rate the mel front end (and the real model) expects."""
OUTPUT_SAMPLE_RATE: Final = 24_000
"""Waveform rate code2wav produces."""
SAMPLES_PER_FRAME: Final = 1920
"""Output samples per codec frame: prod(upsampling_ratios + upsample_rates) = 2*2*8*5*4*3."""
FRAME_RATE_HZ: Final = OUTPUT_SAMPLE_RATE / SAMPLES_PER_FRAME
"""12.5 codec frames per second, as in Qwen3-Omni."""
CODEBOOK_SIZE: Final = 128
"""Entries per codec codebook (2048 in the real model)."""
DEFAULT_NUM_CODE_GROUPS: Final = 4
"""Codebooks per frame. The real model has 16; each extra group costs one more sequential
code-predictor forward (about 1 ms on CPU) per frame, so tiny-omni keeps 4 by default."""
HIDDEN: Final = 64
"""Width shared by every tiny stage, so thinker states feed the talker without resizing."""
THINKER_HEAD_DIM: Final = 32
"""The thinker's attention head size: the smallest vLLM's CPU attention accepts."""


_CODEC_PAD: Final = CODEBOOK_SIZE
"""Talker codec ids start after the codebook, as in the real talker vocabulary."""
_CODEC_BOS: Final = CODEBOOK_SIZE + 1
_CODEC_EOS: Final = CODEBOOK_SIZE + 2
_CODEC_NOTHINK: Final = CODEBOOK_SIZE + 3
_CODEC_THINK_BOS: Final = CODEBOOK_SIZE + 4
_CODEC_THINK_EOS: Final = CODEBOOK_SIZE + 5
_SPEAKERS: Final = {
    "ethan": CODEBOOK_SIZE + 8,
    "chelsie": CODEBOOK_SIZE + 9,
    "aiden": CODEBOOK_SIZE + 10,
}
"""Speaker name -> codec id (``talker_config.speaker_id``); the real names, so HF's default
``speaker="Ethan"`` works."""


_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_saved: tuple[int, bool] = (logging.NOTSET, True)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and rope-key warnings for the enclosed calls.

    The talker's text config does not whitelist the ``mrope_section`` keys that its own
    rotary embedding reads (the real checkpoint triggers the same warning), and saving or
    loading a 2 MB stage should not draw tqdm bars on a server's stderr. The settings are
    process-wide and engines load in threads of their own, at once: the first caller in
    silences, the last one out restores, so overlapping loads never re-enable the bars
    under each other.
    """
    global _quiet_depth, _quiet_saved
    rope_logger = logging.getLogger("transformers.modeling_rope_utils")
    with _quiet_lock:
        if _quiet_depth == 0:
            _quiet_saved = (rope_logger.level, hf_logging.is_progress_bar_enabled())
            rope_logger.setLevel(logging.ERROR)
            hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                level, bars = _quiet_saved
                rope_logger.setLevel(level)
                if bars:
                    hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def audio_feature_extractor() -> WhisperFeatureExtractor:
    """tiny-omni's mel front end (written to ``preprocessor_config.json``; the thinker
    builds its own from that file).

    Qwen3-Omni uses a Whisper feature extractor with 128 mel bins at 16 kHz and a 10 ms hop;
    call it with ``padding=True, truncation=False, return_attention_mask=True`` as the real
    processor does, giving ``input_features`` [B, 128, n_samples // 160] and an
    ``attention_mask`` [B, frames] to pass to the thinker as ``feature_attention_mask``.
    """
    return WhisperFeatureExtractor(  # type: ignore[no-untyped-call]
        feature_size=128,
        sampling_rate=AUDIO_SAMPLE_RATE,
        hop_length=160,
        chunk_length=30,
        n_fft=400,
        padding_value=0.0,
        return_attention_mask=True,
    )


def _undeclared(seed: int, **fields: Any) -> dict[str, Any]:
    # Attributes the config dataclasses do not declare; HF keeps them and saves them. The
    # thinker's and talker's rope-index code reads vision_start_token_id/spatial_merge_size.
    return {"tiny_omni_seed": seed, **fields}


def _mrope(theta: float, head_dim: int) -> dict[str, object]:
    # head_dim / 2 rotary frequencies split over (t, h, w) like the real [24, 20, 20].
    quarter = head_dim // 8
    return {
        "rope_type": "default",
        "rope_theta": theta,
        "mrope_section": [2 * quarter, quarter, quarter],
        "interleaved": True,
        "mrope_interleaved": True,
    }


def _thinker(seed: int, vocab: TinyVocab) -> Qwen3OmniMoeThinkerConfig:
    text = {
        "vocab_size": vocab.size,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        # 32, not 16: vLLM's CPU attention takes head sizes of 32 and up, and the same
        # weights serve the torch thinker and the vLLM one.
        "head_dim": THINKER_HEAD_DIM,
        "moe_intermediate_size": 64,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 32768,
        "rope_parameters": _mrope(1_000_000.0, THINKER_HEAD_DIM),
        "pad_token_id": vocab.id("<|endoftext|>"),
        "eos_token_id": vocab.id("<|im_end|>"),
    }
    audio = {
        "num_mel_bins": 128,  # must match the feature extractor
        "encoder_layers": 2,
        "encoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "d_model": HIDDEN,
        "output_dim": HIDDEN,  # audio embeddings replace AUDIO_PAD token embeddings
        "downsample_hidden_size": 32,
        "max_source_positions": 1500,
        "n_window": 50,
        "n_window_infer": 800,
    }
    # The thinker class always builds a vision tower; keep it minimal (text/audio never use it).
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": HIDDEN,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
    }
    return Qwen3OmniMoeThinkerConfig(
        text_config=text,
        audio_config=audio,
        vision_config=vision,
        audio_token_id=vocab.id("<|audio_pad|>"),
        audio_start_token_id=vocab.id("<|audio_start|>"),
        image_token_id=vocab.id("<|image_pad|>"),
        video_token_id=vocab.id("<|video_pad|>"),
        user_token_id=vocab.id("user"),
        **_undeclared(
            seed,
            vision_start_token_id=vocab.id("<|vision_start|>"),
            audio_end_token_id=vocab.id("<|audio_end|>"),
        ),
    )


def _talker(seed: int, num_code_groups: int, vocab: TinyVocab) -> Qwen3OmniMoeTalkerConfig:
    text = {
        # Codes [0, CODEBOOK_SIZE) then 1024 special ids, so HF's suppression of the top 1024
        # ids (all but codec EOS) leaves exactly the codebook, as in the real 2048 + 1024.
        "vocab_size": CODEBOOK_SIZE + 1024,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,  # also the width of text_projection / hidden_projection
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 32768,
        "rope_parameters": _mrope(1_000_000.0, HIDDEN // 4),  # head_dim: hidden / heads
    }
    code_predictor = {
        "vocab_size": CODEBOOK_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_code_groups": num_code_groups,
        "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    }
    return Qwen3OmniMoeTalkerConfig(
        text_config=text,
        code_predictor_config=code_predictor,
        num_code_groups=num_code_groups,
        thinker_hidden_size=HIDDEN,
        accept_hidden_layer=1,  # hidden_states[1]: output of thinker layer 0 (real: 18 of 48)
        codec_pad_id=_CODEC_PAD,
        codec_bos_id=_CODEC_BOS,
        codec_eos_token_id=_CODEC_EOS,
        codec_nothink_id=_CODEC_NOTHINK,
        codec_think_bos_id=_CODEC_THINK_BOS,
        codec_think_eos_id=_CODEC_THINK_EOS,
        speaker_id=dict(_SPEAKERS),
        audio_token_id=vocab.id("<|audio_pad|>"),
        audio_start_token_id=vocab.id("<|audio_start|>"),
        image_token_id=vocab.id("<|image_pad|>"),
        video_token_id=vocab.id("<|video_pad|>"),
        vision_start_token_id=vocab.id("<|vision_start|>"),
        **_undeclared(seed, spatial_merge_size=2),
    )


def _code2wav(seed: int, num_code_groups: int) -> Qwen3OmniMoeCode2WavConfig:
    return Qwen3OmniMoeCode2WavConfig(
        codebook_size=CODEBOOK_SIZE,
        num_quantizers=num_code_groups,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=128,
        num_hidden_layers=2,
        # With 2 layers the transformer sees < 20 frames back, so 25 frames of left context
        # make a streamed chunk bit-for-bit the full decode (the real window is 72).
        sliding_window=8,
        max_position_embeddings=8000,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        # Lists, not tuples: the model adds the two, and JSON reloads them as lists.
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        decoder_dim=64,  # channels 64 -> 32 -> 16 -> 8 -> 4 through the four decoder blocks
        # 0.02 leaves the random decoder at ~1e-6 amplitude (silence); 0.075 gives audible
        # noise of ~0.05 RMS without clipping, so level meters and demos have signal.
        initializer_range=0.075,
        **_undeclared(seed),
    )


def tiny_configs(
    seed: int = 0,
    *,
    num_code_groups: int = DEFAULT_NUM_CODE_GROUPS,
    vocab: TinyVocab | None = None,
) -> Qwen3OmniMoeConfig:
    """The tiny-omni configuration, as the real composite config type.

    Returning ``Qwen3OmniMoeConfig`` keeps the pipeline-level special ids (``im_start``,
    ``tts_bos``/``tts_eos``/``tts_pad``, role tokens) where Qwen3-Omni keeps them; each stage
    is still built and saved from its own sub-config (``thinker_config``, ``talker_config``,
    ``code2wav_config``).

    Args:
        seed: Recorded as ``tiny_omni_seed`` in each stage config so a saved directory
            says which weights it holds; the weights themselves are drawn by
            :func:`omni_actors.actors.engines.qwen3_omni.weights.build`.
        num_code_groups: Codebooks per codec frame (talker groups == code2wav quantizers).
        vocab: where the text tokens sit (default: tiny-omni's layout); the config's
            special ids are those of its tokens.

    Returns:
        The composite configuration.
    """
    if num_code_groups < 2:
        raise ValueError("num_code_groups must be >= 2 (one talker code + the code predictor's)")
    vocab = vocab or TinyVocab()
    with quiet_transformers():
        talker = _talker(seed, num_code_groups, vocab)
    return Qwen3OmniMoeConfig(
        thinker_config=_thinker(seed, vocab),
        talker_config=talker,
        code2wav_config=_code2wav(seed, num_code_groups),
        im_start_token_id=vocab.id("<|im_start|>"),
        im_end_token_id=vocab.id("<|im_end|>"),
        tts_pad_token_id=vocab.id("<tts_pad>"),
        tts_bos_token_id=vocab.id("<tts_text_bos>"),
        tts_eos_token_id=vocab.id("<tts_text_eod>"),
        system_token_id=vocab.id("system"),
        user_token_id=vocab.id("user"),
        assistant_token_id=vocab.id("assistant"),
        **_undeclared(seed),
    )
