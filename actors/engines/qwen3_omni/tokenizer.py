"""Tokenizer files for tiny-omni's thinker, in the Hugging Face layout.

tiny-omni's text vocabulary is byte-level (:func:`configs.encode_text`: ids 0-255 are
the UTF-8 bytes) followed by the special tokens of :class:`configs.Tokens`. The engines
need no tokenizer file, but a server that loads a model directory the standard way (vLLM,
``transformers.AutoTokenizer``) does, so :func:`write_tokenizer` writes one that
tokenizes exactly like :func:`configs.encode_text`:

- ``tokenizer.json``: a ``tokenizers`` BPE model with no merges over the 256 byte
  symbols of the GPT-2 byte-level alphabet (Qwen's own scheme), symbol of byte ``b`` ->
  id ``b``. Without merges every byte stays one token, so any text encodes to its UTF-8
  bytes; no normalizer (Qwen's NFC would change the bytes of non-NFC text). The special
  tokens follow as added tokens at their ``Tokens`` ids, then reserved ones up to the
  thinker's vocabulary size, so every id the thinker can emit decodes.
- ``tokenizer_config.json``: the generic fast tokenizer class (model-specific classes
  rebuild the pipeline from their own defaults), ``eos_token`` ``<|im_end|>``, no BOS,
  pad ``<|endoftext|>``, the multimodal token attributes HF's Qwen3-Omni processor reads
  (``audio_token`` ...), and a Qwen-style chat template.
- ``special_tokens_map.json``: the same special tokens, for loaders that read only it.

The chat template renders ``<|im_start|><|user|>\\n ... <|im_end|>\\n``: the role is the
special ``<|user|>`` token rather than Qwen's plain word ``user``, because tiny-omni's
prompt layout (and HF's talker, which finds turns by ``user_token_id``) needs the role as
one id, and a plain-word token would also swallow "user" inside ordinary text. Special
token strings typed inside text map to their ids, as with any HF tokenizer; pass
``split_special_tokens=True`` to get their bytes instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from .configs import TEXT_VOCAB_SIZE, Tokens

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "byte_symbols", "write_tokenizer"]

SPECIAL_TOKENS: Final[dict[int, str]] = {
    Tokens.IM_START: "<|im_start|>",
    Tokens.IM_END: "<|im_end|>",
    Tokens.END_OF_TEXT: "<|endoftext|>",
    Tokens.AUDIO_START: "<|audio_start|>",
    Tokens.AUDIO_END: "<|audio_end|>",
    Tokens.AUDIO_PAD: "<|audio_pad|>",
    Tokens.TTS_PAD: "<tts_pad>",
    Tokens.TTS_BOS: "<tts_text_bos>",
    Tokens.TTS_EOS: "<tts_text_eod>",
    Tokens.SYSTEM: "<|system|>",
    Tokens.USER: "<|user|>",
    Tokens.ASSISTANT: "<|assistant|>",
    Tokens.VISION_START: "<|vision_start|>",
    Tokens.VISION_END: "<|vision_end|>",
    Tokens.IMAGE_PAD: "<|image_pad|>",
    Tokens.VIDEO_PAD: "<|video_pad|>",
}
"""Id -> text of each special token: Qwen3-Omni's names, plus one token per chat role."""

_MULTIMODAL: Final = {
    "audio_token": SPECIAL_TOKENS[Tokens.AUDIO_PAD],
    "audio_bos_token": SPECIAL_TOKENS[Tokens.AUDIO_START],
    "audio_eos_token": SPECIAL_TOKENS[Tokens.AUDIO_END],
    "image_token": SPECIAL_TOKENS[Tokens.IMAGE_PAD],
    "video_token": SPECIAL_TOKENS[Tokens.VIDEO_PAD],
    "vision_bos_token": SPECIAL_TOKENS[Tokens.VISION_START],
    "vision_eos_token": SPECIAL_TOKENS[Tokens.VISION_END],
}
"""Tokenizer attributes ``Qwen3OmniMoeProcessor`` reads to expand media placeholders."""

CHAT_TEMPLATE: Final = r"""{%- for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('tiny-omni chat roles are system, user and assistant') }}
    {%- endif %}
    {{- '<|im_start|><|' + message.role + '|>\n' }}
    {%- if message.content is string %}
        {{- message.content }}
    {%- else %}
        {%- for part in message.content %}
            {%- if part.type == 'text' %}
                {{- part.text }}
            {%- elif part.type in ['audio', 'audio_url', 'input_audio'] %}
                {{- '<|audio_start|><|audio_pad|><|audio_end|>' }}
            {%- elif part.type in ['image', 'image_url'] %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif part.type in ['video', 'video_url'] %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|><|assistant|>\n' }}
{%- endif %}
"""
"""Qwen's im_start/im_end turns with tiny-omni's role tokens; one placeholder per media
part, which the processor expands to the media's length."""


def byte_symbols() -> list[str]:
    """The GPT-2 byte-level alphabet: symbol of byte ``b`` at index ``b``.

    ``tokenizers``' ``ByteLevel`` pre-tokenizer maps each byte to this printable symbol
    (bytes that are printable Latin-1 map to themselves, the others to ``U+0100`` on,
    in byte order); the BPE vocabulary must be keyed by these symbols.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + shifted)
            shifted += 1
    return [symbols[b] for b in range(256)]


def _special_tokens() -> dict[int, str]:
    """Every id past the bytes: the named specials, then reserved ones to the vocab size."""
    reserved = {
        i: f"<|reserved_special_token_{i - 256 - len(SPECIAL_TOKENS)}|>"
        for i in range(256 + len(SPECIAL_TOKENS), TEXT_VOCAB_SIZE)
    }
    return {**SPECIAL_TOKENS, **reserved}


def _tokenizer() -> Tokenizer:
    symbols = byte_symbols()
    tokenizer = Tokenizer(models.BPE(vocab={s: b for b, s in enumerate(symbols)}, merges=[]))
    # No regex split: without merges it would not change a single id.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = _special_tokens()
    if sorted(specials) != list(range(256, 256 + len(specials))):
        raise ValueError("special token ids must follow the bytes without gaps")
    # Added tokens take the next free ids in order, which are exactly their Tokens ids.
    tokenizer.add_special_tokens(
        [AddedToken(specials[i], special=True, normalized=False) for i in sorted(specials)]
    )
    wrong = {
        t: tokenizer.token_to_id(t) for i, t in specials.items() if tokenizer.token_to_id(t) != i
    }
    if wrong:
        raise RuntimeError(f"special tokens got ids other than tiny-omni's: {wrong}")
    return tokenizer


def _added_token(content: str) -> dict[str, Any]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def write_tokenizer(out_dir: Path) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``.

    Deterministic (same bytes on every call), so a prepared directory does not change
    when rebuilt. Load with ``AutoTokenizer.from_pretrained(out_dir)``.

    Args:
        out_dir: Created if missing; existing tokenizer files are replaced.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _tokenizer().save(str(out_dir / "tokenizer.json"), pretty=True)
    specials = _special_tokens()
    names = [specials[i] for i in sorted(specials)]
    eos, pad = SPECIAL_TOKENS[Tokens.IM_END], SPECIAL_TOKENS[Tokens.END_OF_TEXT]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(i): _added_token(specials[i]) for i in sorted(specials)},
        "bos_token": None,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": None,
        # The list makes every special id count as special (all_special_ids, skipped when
        # decoding); the media attributes processors read are ``*_token`` keys of their
        # own. Not a dict of them under ``extra_special_tokens`` beside the list under the
        # deprecated ``additional_special_tokens``: transformers before 5.19 drops the list
        # when the dict is there. This form reads the same across the supported range.
        "extra_special_tokens": names,
        **_MULTIMODAL,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    special_map = {"eos_token": eos, "pad_token": pad, "additional_special_tokens": names}
    for name, data in (("tokenizer_config.json", config), ("special_tokens_map.json", special_map)):
        (out_dir / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
