"""``tiny-cascade``: a recognizer, an LLM and a synthesizer at toy size, seeded random
weights, each in its published layout.

The prepared directory holds one checkpoint per stage, each as its release on the Hub
is laid out, so the cascade's engines load them as they load the real ones:

- ``asr/``: a Whisper checkpoint (:mod:`~omni_actors.actors.engines.asr.tiny_whisper`);
- ``llm/``: a Qwen3 causal LM (``config.json``, ``model.safetensors``, Qwen's tokenizer
  files with its chat template), as ``Qwen/Qwen3-8B``;
- ``tts/``: a Sesame CSM (``CsmForConditionalGeneration``: backbone, depth decoder and
  its Mimi codec), as ``sesame/csm-1b``, with the same byte-level tokenizer;
- ``mimi/``: the CSM's own codec alone (``MimiModel``), as ``kyutai/mimi``: what the
  decoder stage loads.

The synthesizer's codebooks are exactly the codec's (its ``vocab_size`` is the codec's
``codebook_size``), so every frame random weights write decodes. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from omni_actors.models.family import Progress
from omni_actors.models.files import check_present, staging

__all__ = [
    "CODEBOOKS",
    "QWEN3_8B",
    "STAGES",
    "TTS_SPECIALS",
    "WHISPER_TURBO",
    "verify",
    "write_tiny_cascade",
]

STAGES: Final = ("asr", "llm", "tts", "mimi")
"""The subdirectories of a prepared tiny-cascade, one checkpoint each."""

CODEBOOKS: Final = 4
"""Codebooks per frame of the tiny synthesizer and codec (CSM-1B has 32)."""

TTS_SPECIALS: Final = {"bos": "<|endoftext|>", "eos": "<|im_end|>"}
"""The tokens the tiny synthesizer's text prompt opens and ends with."""

WHISPER_TURBO: Final[dict[str, Any]] = {
    "d_model": 1280,
    "encoder_layers": 32,
    "decoder_layers": 4,
    "encoder_attention_heads": 20,
    "decoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "decoder_ffn_dim": 5120,
    "num_mel_bins": 128,
    "vocab_size": 51866,
}
"""``openai/whisper-large-v3-turbo``'s sizes."""

QWEN3_8B: Final[dict[str, Any]] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
"""``Qwen/Qwen3-8B``'s sizes."""

_TINY_LLM: Final[dict[str, Any]] = {
    "vocab_size": 288,  # tiny-omni's tokenizer
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention takes heads of 32 and up (tiny-cascade-vllm)
    "max_position_embeddings": 4096,
    # Untied and drawn wide, as Qwen3-8B's head is its own: a tiny tied model's greedy
    # reply repeats one byte; this one writes varied words.
    "tie_word_embeddings": False,
    "initializer_range": 1.0,
}

_FILES: Final = {
    "asr": ("config.json", "model.safetensors", "tokenizer_config.json"),
    "llm": ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"),
    "tts": ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"),
    "mimi": ("config.json", "model.safetensors"),
}


def write_tiny_cascade(
    out_dir: Path, seed: int, progress: Progress | None = None, *, full_size: bool = False
) -> None:
    """Write the tiny cascade drawn with ``seed`` into ``out_dir`` (module docstring).

    ``full_size``: each model at its real release's size instead (Whisper
    large-v3-turbo, Qwen3-8B, CSM-1B with its 32-codebook Mimi; about 21 GB in bf16,
    drawn on the GPU when there is one), with the same tokenizers: ``cascade-random``.

    Written into a staging directory beside ``out_dir`` and moved in, so an interrupted
    write leaves nothing that looks like a checkpoint.
    """
    from omni_actors.actors.engines.asr.tiny_whisper import write_tiny_whisper

    with staging(out_dir, ".tiny-cascade-") as where:
        write_tiny_whisper(where / "asr", seed, sizes=WHISPER_TURBO if full_size else None)
        _report(progress, "asr")
        _write_llm(where / "llm", seed, full_size)
        _report(progress, "llm")
        _write_tts(where / "tts", where / "mimi", seed, full_size)
        _report(progress, "tts")
        _report(progress, "mimi")


@contextmanager
def _drawing(seed: int, full_size: bool) -> Iterator[None]:
    """Where a model is drawn: seeded, quiet, and at full size in bf16 on the GPU when
    there is one (Qwen3-8B in float32 on a CPU would take 33 GB)."""
    import torch

    from omni_actors.actors.engines.qwen3_omni.configs import quiet_transformers

    with torch.random.fork_rng(devices=[]), quiet_transformers():
        torch.manual_seed(seed)
        if not full_size:
            yield
            return
        dtype = torch.get_default_dtype()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(device):
                yield
        finally:
            torch.set_default_dtype(dtype)


def _report(progress: Progress | None, stage: str) -> None:
    if progress is not None:
        progress(stage, STAGES.index(stage) + 1, len(STAGES))


def _id(tokenizer: Any, token: str) -> int:
    """``token``'s id in ``tokenizer`` (one of the specials the files declare)."""
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int), f"{token} is one token"
    return found


def _write_llm(out: Path, seed: int, full_size: bool) -> None:

    from omni_actors.actors.engines.cascade.hf import (
        AutoTokenizer,
        GenerationConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
    )
    from omni_actors.actors.engines.qwen3_omni.tokenizer import write_tokenizer

    write_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    end = _id(tokenizer, "<|im_end|>")
    pad = _id(tokenizer, "<|endoftext|>")
    config = Qwen3Config(
        **(QWEN3_8B if full_size else _TINY_LLM),
        bos_token_id=pad,
        eos_token_id=end,
        pad_token_id=pad,
    )
    with _drawing(seed, full_size):
        model = Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call,unused-ignore]
        model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call,unused-ignore]
            do_sample=False, eos_token_id=end, pad_token_id=pad, bos_token_id=pad
        )
        model.save_pretrained(out)


def _write_tts(out: Path, mimi_out: Path, seed: int, full_size: bool) -> None:
    from omni_actors.actors.engines.cascade.hf import (
        AutoTokenizer,
        CsmConfig,
        CsmForConditionalGeneration,
        GenerationConfig,
    )
    from omni_actors.actors.engines.qwen3_omni.tokenizer import write_tokenizer

    write_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    bos = _id(tokenizer, TTS_SPECIALS["bos"])
    ids: dict[str, Any] = {
        "bos_token_id": bos,
        "pad_token_id": _id(tokenizer, "<|endoftext|>"),
        "audio_token_id": _id(tokenizer, "<|audio_pad|>"),
        "audio_eos_token_id": _id(tokenizer, "<|audio_end|>"),
    }
    # CsmConfig's defaults are CSM-1B's, its codec's are Mimi's.
    config = CsmConfig(**ids) if full_size else _tiny_csm(len(tokenizer), ids)
    with _drawing(seed, full_size):
        model = CsmForConditionalGeneration(config)  # type: ignore[no-untyped-call,unused-ignore]
        model.eval()  # type: ignore[no-untyped-call,unused-ignore]
        model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call,unused-ignore]
            do_sample=False, max_new_tokens=64
        )
        model.depth_decoder.generation_config = GenerationConfig(  # type: ignore[no-untyped-call,unused-ignore]
            do_sample=False
        )
        model.save_pretrained(out)  # type: ignore[no-untyped-call,unused-ignore]
        model.codec_model.save_pretrained(mimi_out)


def _tiny_csm(text_vocab: int, ids: dict[str, Any]) -> Any:
    """tiny-cascade's CSM config: its codebooks are exactly its codec's."""
    from omni_actors.actors.engines.cascade.hf import CsmConfig, CsmDepthDecoderConfig, MimiConfig

    codebook = 64
    codec = MimiConfig(
        hidden_size=16,
        num_filters=4,
        codebook_size=codebook,
        codebook_dim=8,
        vector_quantization_hidden_dimension=8,
        num_quantizers=CODEBOOKS,
        upsample_groups=16,
        num_hidden_layers=1,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
    )
    depth = CsmDepthDecoderConfig(
        num_codebooks=CODEBOOKS,
        backbone_hidden_size=32,
        vocab_size=codebook,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=CODEBOOKS,
    )
    return CsmConfig(
        num_codebooks=CODEBOOKS,
        vocab_size=codebook,
        text_vocab_size=text_vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        codebook_pad_token_id=codebook - 1,
        codebook_eos_token_id=0,
        **ids,
        depth_decoder_config=depth.to_dict(),
        codec_config=codec.to_dict(),
    )


def verify(out_dir: Path) -> None:
    """Check that ``out_dir`` holds a whole tiny-cascade (each stage's files exist and
    are not empty), without loading it.

    Raises:
        ModelFileError: the first missing or empty file.
    """
    check_present(out_dir / stage / name for stage, names in _FILES.items() for name in names)
