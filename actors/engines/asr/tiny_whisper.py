"""``tiny-whisper``: Whisper's architecture at toy size, seeded random weights.

Written in the layout any transformers Whisper checkpoint has (``config.json``,
``generation_config.json``, ``model.safetensors``, the processor's tokenizer and feature
extractor files), so the ``transformers.asr`` engine loads it as it loads
``openai/whisper-large-v3``: the path a real checkpoint takes runs for real on a 2-core
CPU with no download. The tokenizer is byte-level with no merges (every byte one token)
and Whisper's special tokens; decoding may pick printable ASCII bytes only, so a
transcript is random but readable text, the same for the same audio and seed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omni_actors.models.family import Progress
from omni_actors.models.files import check_present, staging

__all__ = ["FILES", "SPECIALS", "verify", "write_tiny_whisper"]

SPECIALS = (
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
)
"""Whisper's special tokens, ids 256 on (after the 256 bytes)."""

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json")
"""Files a prepared directory must hold (the processor's others come with them)."""

_PRINTABLE = range(0x20, 0x7F)


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as the printable character that spells it
    in a byte-level BPE vocabulary."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def write_tiny_whisper(
    out_dir: Path,
    seed: int,
    progress: Progress | None = None,
    *,
    sizes: Mapping[str, int] | None = None,
) -> None:
    """Write the tiny Whisper checkpoint drawn with ``seed`` into ``out_dir``.

    ``sizes`` overrides ``WhisperConfig``'s sizes (``d_model``, layers, heads,
    ``num_mel_bins``, ``vocab_size`` at least the tokenizer's): a release of a real
    Whisper's shape with the same tokenizer, for GPU benches.

    The files are written into a staging directory beside ``out_dir`` first, then moved
    in, so an interrupted write leaves nothing that looks like a checkpoint.
    """
    from omni_actors.actors.engines.asr.hf import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )
    from omni_actors.actors.engines.qwen3_omni.configs import quiet_transformers
    from omni_actors.models.seeded import redraw

    with staging(out_dir, ".tiny-whisper-") as where:
        chars = _byte_chars()
        (where / "vocab.json").write_text(json.dumps({chars[b]: b for b in range(256)}))
        (where / "merges.txt").write_text("#version: 0.2\n")
        eot = SPECIALS[0]
        tokenizer = WhisperTokenizer(
            str(where / "vocab.json"),
            str(where / "merges.txt"),
            unk_token=eot,
            bos_token=eot,
            eos_token=eot,
            pad_token=eot,
        )
        tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIALS[1:])})
        ids: dict[str, int] = {}
        for token in SPECIALS:
            found = tokenizer.convert_tokens_to_ids(token)
            assert isinstance(found, int)
            ids[token] = found
        shape: dict[str, Any] = {
            "vocab_size": len(tokenizer),
            "num_mel_bins": 80,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "d_model": 32,
            "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64,
            **(sizes or {}),
        }
        config = WhisperConfig(
            **shape,
            max_source_positions=1500,
            max_target_positions=448,  # as in every Whisper
            decoder_start_token_id=ids["<|startoftranscript|>"],
            eos_token_id=ids[eot],
            pad_token_id=ids[eot],
            bos_token_id=ids[eot],
            begin_suppress_tokens=None,
            suppress_tokens=None,
        )
        model = WhisperForConditionalGeneration(config)
        model.eval()  # type: ignore[no-untyped-call,unused-ignore]
        # Its initializers drew from the global RNG, which other threads share (a
        # transcriber prepares this on first use while the pipeline's other stages
        # load): every weight is drawn again from the seed and its name alone.
        redraw(model, seed, keep=("model.encoder.embed_positions.weight",))  # sinusoids
        # Random weights pick any id: only printable bytes (and the end) may be decoded.
        unprintable = [
            i for i in range(shape["vocab_size"]) if i not in _PRINTABLE and i != ids[eot]
        ]
        model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call,unused-ignore]
            decoder_start_token_id=ids["<|startoftranscript|>"],
            eos_token_id=ids[eot],
            pad_token_id=ids[eot],
            no_timestamps_token_id=ids["<|notimestamps|>"],
            prev_sot_token_id=ids["<|startofprev|>"],
            lang_to_id={"<|en|>": ids["<|en|>"]},
            task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
            is_multilingual=True,
            suppress_tokens=unprintable,
        )
        with quiet_transformers():  # the caller's ``progress`` reports the write
            model.save_pretrained(where)
        extractor = WhisperFeatureExtractor(feature_size=shape["num_mel_bins"])  # type: ignore[no-untyped-call,unused-ignore]
        processor = WhisperProcessor(  # type: ignore[no-untyped-call,unused-ignore]
            feature_extractor=extractor, tokenizer=tokenizer
        )
        processor.save_pretrained(where)
    if progress is not None:
        progress("tiny-whisper", 1, 1)


def verify(out_dir: Path) -> None:
    """Check that ``out_dir`` holds a whole tiny-whisper checkpoint (its files exist and
    are not empty), without loading it.

    Raises:
        ModelFileError: the first missing or empty file.
    """
    check_present(out_dir / name for name in FILES)
