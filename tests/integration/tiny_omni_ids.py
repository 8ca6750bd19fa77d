"""tiny-omni's token ids as its writer lays them out, and its tokenizer, for references.

The engines read every id from the release (``Vocabulary``); the reference prompts the
tests build for HF come from here instead: the writer's layout and the written tokenizer
loaded by ``transformers`` alone, so a reference shares no id with the engines' reading.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any, Final

from transformers import AutoTokenizer, WhisperFeatureExtractor

from omni_actors.actors.engines.qwen3_omni.tokenizer import TinyVocab, write_tokenizer
from omni_actors.actors.engines.qwen3_omni.weights import front_end_configs

VOCAB: Final = TinyVocab()

PRINTABLE: Final = range(32, 127)
"""The printable byte ids, which the tests' thinkers are restricted to."""
PRINTABLE_RANGES: Final = [(PRINTABLE.start, PRINTABLE.stop)]
TINY_TALKER: Final = {"frames_per_token": 2, "stop_at_codec_eos": False}
"""The talker as the tiny-omni presets run it: EOS masked, 2 frames per token."""
"""``allowed_token_ranges`` for them."""
NEWLINE: Final = ord("\n")


class Tokens:
    """tiny-omni's special and role ids."""

    IM_START: Final = VOCAB.id("<|im_start|>")
    IM_END: Final = VOCAB.id("<|im_end|>")
    END_OF_TEXT: Final = VOCAB.id("<|endoftext|>")
    AUDIO_START: Final = VOCAB.id("<|audio_start|>")
    AUDIO_END: Final = VOCAB.id("<|audio_end|>")
    AUDIO_PAD: Final = VOCAB.id("<|audio_pad|>")
    TTS_PAD: Final = VOCAB.id("<tts_pad>")
    TTS_BOS: Final = VOCAB.id("<tts_text_bos>")
    TTS_EOS: Final = VOCAB.id("<tts_text_eod>")
    SYSTEM: Final = VOCAB.id("system")
    USER: Final = VOCAB.id("user")
    ASSISTANT: Final = VOCAB.id("assistant")


@functools.cache
def tokenizer() -> Any:
    """tiny-omni's tokenizer, as ``AutoTokenizer`` loads the written files."""
    with tempfile.TemporaryDirectory() as directory:
        write_tokenizer(Path(directory))
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)


@functools.cache
def feature_extractor() -> Any:
    """tiny-omni's mel front end, as ``transformers`` loads its written file."""
    name = "preprocessor_config.json"
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / name).write_text(json.dumps(front_end_configs()[name]))
        return WhisperFeatureExtractor.from_pretrained(directory, local_files_only=True)


def encode(text: str) -> list[int]:
    """``text``'s ids, special-token strings kept as text."""
    ids: list[int] = tokenizer().encode(text, add_special_tokens=False, split_special_tokens=True)
    return ids


def user_turn(text: str) -> list[int]:
    return [Tokens.IM_START, Tokens.USER, NEWLINE, *encode(text), Tokens.IM_END, NEWLINE]


def system_turn(text: str) -> list[int]:
    return [Tokens.IM_START, Tokens.SYSTEM, NEWLINE, *encode(text), Tokens.IM_END, NEWLINE]


def assistant_turn(ids: list[int] | tuple[int, ...]) -> list[int]:
    return [Tokens.IM_START, Tokens.ASSISTANT, NEWLINE, *ids, Tokens.IM_END, NEWLINE]


ASSISTANT_OPENING: Final = [Tokens.IM_START, Tokens.ASSISTANT, NEWLINE]
