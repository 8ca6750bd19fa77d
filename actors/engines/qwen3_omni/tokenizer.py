"""tiny-omni's tokenizer, written in the files Qwen publishes its tokenizer in.

The engines read every id from a release's tokenizer and ``config.json``
(:class:`~.vocabulary.Vocabulary`), so tiny-omni ships a tokenizer of the same kind as
Qwen3-Omni's, only tiny: GPT-2 byte-level BPE.

- Ids 0-255 are the 256 byte symbols (symbol of byte ``b`` -> id ``b``): without a
  merge every byte stays one token, so the printable bytes are the id range 32-126.
- A few merges make ``system``, ``user`` and ``assistant`` one token each, as in Qwen's
  vocabulary, where the chat template's roles are those plain words (8948, 872, 77091).
- Then Qwen3-Omni's special tokens, under their names (``<|im_start|>``, ``<tts_pad>``,
  ``<|audio_pad|>``...), then reserved ones up to the thinker's vocabulary size, so every
  id the thinker can emit decodes.

:class:`TinyVocab` places them: ``shift`` puts that many filler tokens after the bytes,
moving every other id up, and ``size`` sets the vocabulary size; a release built with
other values than the defaults checks that nothing reads tiny-omni's ids by habit.

Files (:func:`write_tokenizer`): ``vocab.json`` and ``merges.txt`` (what
``Qwen2Tokenizer`` builds from), ``tokenizer.json`` (the same tokenizer for fast loaders:
Qwen's NFC normalizer, its split regex, byte-level symbols), ``tokenizer_config.json``
(``added_tokens_decoder`` with the special tokens, as Qwen's; the chat template too),
``special_tokens_map.json`` and ``chat_template.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

__all__ = [
    "CHAT_TEMPLATE",
    "MERGES",
    "QWEN3_OMNI_SPECIALS",
    "PlacedVocab",
    "SPECIAL_NAMES",
    "TEXT_VOCAB_SIZE",
    "TinyVocab",
    "byte_symbols",
    "write_tokenizer",
]

TEXT_VOCAB_SIZE: Final = 288
"""tiny-omni's thinker vocabulary: 256 bytes, 15 merges, 13 special tokens, 4 reserved."""

MERGES: Final = (
    ("u", "s"),
    ("e", "r"),
    ("us", "er"),
    ("s", "y"),
    ("s", "t"),
    ("e", "m"),
    ("sy", "st"),
    ("syst", "em"),
    ("a", "n"),
    ("an", "t"),
    ("st", "ant"),
    ("s", "i"),
    ("a", "s"),
    ("as", "si"),
    ("assi", "stant"),
)
"""BPE merges, by rank: just enough for the three role words to be one token each."""

SPECIAL_NAMES: Final = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<|audio_pad|>",
)
"""Qwen3-Omni's special tokens that tiny-omni keeps, in the release's order."""

_QWEN_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's pre-tokenizer split (``Qwen2Tokenizer``): ``tokenizer.json`` must split as the
class that builds from ``vocab.json`` and ``merges.txt`` does."""

_MULTIMODAL: Final = {
    "audio_token": "<|audio_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}
"""Tokenizer attributes ``Qwen3OmniMoeProcessor`` reads to expand media placeholders."""

CHAT_TEMPLATE: Final = r"""{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for part in content %}
            {%- if part.type in ['audio', 'audio_url', 'input_audio'] %}
                {{- '<|audio_start|><|audio_pad|><|audio_end|>' }}
            {%- elif part.type in ['image', 'image_url'] %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif part.type in ['video', 'video_url'] %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif part.type == 'text' %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content) + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if tools and loop.first and message.role == 'system' %}
    {%- elif message.role in ['system', 'user'] %}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) }}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + render_content(message.content) }}
        {%- for call in message.tool_calls or [] %}
            {%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
            {{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
            {{- call.arguments if call.arguments is string else call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('chat roles are system, user, assistant and tool') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
"""Qwen's turns (``<|im_start|>role\\n ... <|im_end|>\\n``, tool results as a user turn,
``tools`` as Qwen's ``# Tools`` system turn); one placeholder per media part, which the
processor expands to the media's length."""


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


@dataclass(frozen=True)
class TinyVocab:
    """Where tiny-omni's tokens sit (see the module docstring).

    Attributes:
        shift: filler tokens between the bytes and the merges (never produced by
            encoding): every id past the bytes moves up by it.
        size: the thinker's vocabulary size; the ids past the special tokens are
            reserved special tokens.
    """

    shift: int = 0
    size: int = TEXT_VOCAB_SIZE

    def __post_init__(self) -> None:
        if self.shift < 0:
            raise ValueError(f"shift must be >= 0, got {self.shift}")
        if self.size < self.first_special + len(SPECIAL_NAMES):
            need = self.first_special + len(SPECIAL_NAMES)
            raise ValueError(f"a vocabulary shifted by {self.shift} needs size >= {need}")

    @property
    def first_special(self) -> int:
        """The id of the first special token."""
        return 256 + self.shift + len(MERGES)

    @cached_property
    def vocab(self) -> dict[str, int]:
        """The BPE vocabulary (``vocab.json``): bytes, fillers, merged tokens."""
        vocab = {symbol: b for b, symbol in enumerate(byte_symbols())}
        # Byte-level strings no merge produces: encoding never yields them, decoding does.
        vocab.update({f"<fill{i}>": 256 + i for i in range(self.shift)})
        for left, right in MERGES:
            vocab[left + right] = len(vocab)
        return vocab

    @cached_property
    def specials(self) -> dict[int, str]:
        """Id -> text of every added (special) token: Qwen3-Omni's, then reserved ones."""
        return _added_tokens(self.first_special, SPECIAL_NAMES, self.size)

    def id(self, token: str) -> int:
        """The id of ``token``: a special token's name or a vocabulary entry."""
        return _token_id(self.specials, self.vocab, token)


QWEN3_OMNI_SPECIALS: Final = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
"""Qwen3-Omni's added tokens, in the order of their ids (from 151643 in its release)."""


@dataclass(frozen=True)
class PlacedVocab:
    """A byte-level vocabulary whose role words and special tokens sit at given ids:
    a full-size release's, whose ``config.json`` names Qwen's ids (``user`` 872,
    ``<|im_start|>`` 151644...), with the same byte symbols and merges as tiny-omni's.

    Every id below ``first_special`` that is no byte, merged token or role word is a
    filler (never produced by encoding), so the vocabulary is as large as the release's.

    Attributes:
        roles: role word (``system``, ``user``, ``assistant``) -> its id.
        first_special: the id of the first added token.
        special_names: the added tokens, in the order of their ids.
        size: the thinker's vocabulary size; the ids past the added tokens are reserved.
    """

    roles: tuple[tuple[str, int], ...]
    first_special: int
    special_names: tuple[str, ...] = QWEN3_OMNI_SPECIALS
    size: int = 0

    @cached_property
    def vocab(self) -> dict[str, int]:
        """The BPE vocabulary (``vocab.json``): bytes, merged tokens, role words, fillers."""
        vocab = {symbol: b for b, symbol in enumerate(byte_symbols())}
        placed = dict(self.roles)
        taken = set(placed.values())
        free = (i for i in range(256, self.first_special) if i not in taken)
        for left, right in MERGES:
            word = left + right
            vocab[word] = placed[word] if word in placed else next(free)
        used = set(vocab.values())
        vocab.update({f"<fill{i}>": i for i in range(256, self.first_special) if i not in used})
        return vocab

    @cached_property
    def specials(self) -> dict[int, str]:
        """Id -> text of every added token: the named ones, then reserved ones."""
        return _added_tokens(self.first_special, self.special_names, self.size)

    def id(self, token: str) -> int:
        """The id of ``token``: an added token's name or a vocabulary entry."""
        return _token_id(self.specials, self.vocab, token)


def _added_tokens(first: int, names: tuple[str, ...], size: int) -> dict[int, str]:
    """Id -> text of the added tokens: ``names`` from ``first`` on, then reserved ones up
    to the vocabulary's ``size``, so every id the thinker can emit decodes."""
    named = {first + i: name for i, name in enumerate(names)}
    start = first + len(names)
    reserved = {i: f"<|reserved_special_token_{i - start}|>" for i in range(start, size)}
    return {**named, **reserved}


def _token_id(specials: dict[int, str], vocab: dict[str, int], token: str) -> int:
    for i, name in specials.items():
        if name == token:
            return i
    return vocab[token]


def _tokenizer(vocab: TinyVocab | PlacedVocab) -> Tokenizer:
    merges = [(left, right) for left, right in MERGES]
    tokenizer = Tokenizer(models.BPE(vocab=dict(vocab.vocab), merges=merges))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = vocab.specials
    # Added tokens take the next free ids in order: exactly their ids in ``specials``.
    tokenizer.add_special_tokens(
        [AddedToken(specials[i], special=True, normalized=False) for i in sorted(specials)]
    )
    got = {t: tokenizer.token_to_id(t) for t in specials.values()}
    wrong = {t: got[t] for i, t in specials.items() if got[t] != i}
    if wrong:
        raise RuntimeError(f"special tokens got other ids than the layout's: {wrong}")
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


def write_tokenizer(out_dir: Path, vocab: TinyVocab | PlacedVocab | None = None) -> None:
    """Write tiny-omni's tokenizer files (module docstring) into ``out_dir``.

    Deterministic (same bytes on every call), so a prepared directory does not change
    when rebuilt. Load with ``AutoTokenizer.from_pretrained(out_dir)``.

    Args:
        out_dir: Created if missing; existing tokenizer files are replaced.
        vocab: where the tokens sit (default: tiny-omni's own layout).
    """
    vocab = vocab or TinyVocab()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _tokenizer(vocab).save(str(out_dir / "tokenizer.json"), pretty=True)
    (out_dir / "vocab.json").write_text(json.dumps(vocab.vocab, ensure_ascii=False) + "\n")
    header = "#version: 0.2\n"
    (out_dir / "merges.txt").write_text(header + "".join(f"{a} {b}\n" for a, b in MERGES))
    specials = vocab.specials
    names = [specials[i] for i in sorted(specials)]
    eos, pad = "<|im_end|>", "<|endoftext|>"
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
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
        # Also here: AutoTokenizer reads a template from this file, not chat_template.json
        # (which processors read), and a server such as vLLM loads the tokenizer alone.
        "chat_template": CHAT_TEMPLATE,
    }
    special_map = {"eos_token": eos, "pad_token": pad, "additional_special_tokens": names}
    files = {
        "tokenizer_config.json": config,
        "special_tokens_map.json": special_map,
        "chat_template.json": {"chat_template": CHAT_TEMPLATE},
    }
    for name, data in files.items():
        (out_dir / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
