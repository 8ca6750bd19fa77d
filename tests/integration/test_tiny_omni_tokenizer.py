"""tiny-omni's tokenizer files are Qwen's kind and load with ``AutoTokenizer``.

The engines read the tokenizer a release ships (``Vocabulary``); tiny-omni's must be in
the files Qwen3-Omni publishes (``vocab.json`` + ``merges.txt``, ``tokenizer.json``
beside them, ``added_tokens_decoder``, ``chat_template.json``) and behave as Qwen's does
where the engines rely on it: the role words one token each, ``\\n`` one token, the
special tokens at the ids the config names.
"""

from __future__ import annotations

import json
import shutil
import unicodedata
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from jinja2 import TemplateError
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from omni_actors.actors.engines.qwen3_omni import configs
from omni_actors.actors.engines.qwen3_omni.tokenizer import (
    SPECIAL_NAMES,
    TinyVocab,
    byte_symbols,
    write_tokenizer,
)

TEXTS = [
    "Hello, world!",
    "  leading spaces, tabs\tand\nnewlines ",
    "héllo wörld — naïve café",
    "日本語のテキスト 🎉👩‍👩‍👧",
    "e\u0301 (not NFC) and \x00\x7f control bytes",
    "the user said: assistant, system",
    "",
]
FILES = (
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.json",
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-omni-tokenizer")
    write_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(written: Path) -> Any:
    return AutoTokenizer.from_pretrained(written, local_files_only=True)


@pytest.fixture(scope="module")
def from_bpe_files(written: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tokenizer ``Qwen2Tokenizer`` builds from ``vocab.json`` and ``merges.txt``."""
    out = tmp_path_factory.mktemp("bpe-files")
    for name in FILES:
        if name != "tokenizer.json":
            shutil.copy(written / name, out / name)
    return AutoTokenizer.from_pretrained(out, local_files_only=True)


def template(written: Path) -> str:
    chat_template: str = json.loads((written / "chat_template.json").read_text())["chat_template"]
    return chat_template


@pytest.mark.integration
def test_files_are_qwens_layout_and_deterministic(written: Path, tmp_path: Path) -> None:
    assert set(FILES) <= {p.name for p in written.iterdir()}
    write_tokenizer(tmp_path)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (written / name).read_bytes(), name
    config = json.loads((written / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
    assert config["eos_token"] == "<|im_end|>"
    assert config["bos_token"] is None
    decoder = config["added_tokens_decoder"]
    assert [decoder[str(TinyVocab().id(n))]["content"] for n in SPECIAL_NAMES] == list(
        SPECIAL_NAMES
    )
    assert (written / "merges.txt").read_text().splitlines()[:3] == ["#version: 0.2", "u s", "e r"]


@pytest.mark.integration
@pytest.mark.parametrize("text", TEXTS)
def test_every_form_of_the_tokenizer_encodes_alike(
    tokenizer: Any, from_bpe_files: Any, written: Path, text: str
) -> None:
    ids = tokenizer.encode(text)
    assert from_bpe_files.encode(text) == ids
    assert Tokenizer.from_file(str(written / "tokenizer.json")).encode(text).ids == ids
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)  # Qwen's normalizer
    assert tokenizer(text)["input_ids"] == ids  # no BOS/EOS added


@pytest.mark.integration
def test_role_words_and_the_newline_are_one_token_each(tokenizer: Any) -> None:
    vocab = TinyVocab()
    for word in ("system", "user", "assistant"):
        assert tokenizer.encode(word) == [vocab.id(word)]
        assert vocab.id(word) >= 256  # a merged token, not a byte
    assert tokenizer.encode("\n") == [10]
    assert tokenizer.encode("Hi") == list(b"Hi")  # no merge: the bytes


@pytest.mark.parametrize("vocab", [TinyVocab(), TinyVocab(shift=100, size=420)])
@pytest.mark.integration
def test_special_tokens_sit_where_the_layout_and_the_config_put_them(
    vocab: TinyVocab, tmp_path: Path
) -> None:
    write_tokenizer(tmp_path, vocab)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    config: Any = configs.tiny_configs(0, vocab=vocab)
    assert len(tokenizer) == vocab.size == config.thinker_config.text_config.vocab_size
    for name in SPECIAL_NAMES:
        assert tokenizer.encode(name) == [vocab.id(name)]
    assert vocab.id("<|im_start|>") == vocab.first_special + 1 == config.im_start_token_id
    assert tokenizer.eos_token_id == config.im_end_token_id
    assert tokenizer.pad_token_id == vocab.id("<|endoftext|>")
    assert (
        tokenizer.convert_tokens_to_ids(tokenizer.audio_token)
        == config.thinker_config.audio_token_id
    )
    assert set(range(vocab.first_special, vocab.size)) == set(tokenizer.all_special_ids)
    assert tokenizer.convert_ids_to_tokens(list(range(256))) == byte_symbols()
    # Typed in text, a special token's string is the special token (as in any HF
    # tokenizer); split_special_tokens gives its bytes.
    assert tokenizer.encode("<|im_end|>", split_special_tokens=True) == list(b"<|im_end|>")


@pytest.mark.integration
def test_chat_template_gives_qwens_turns(tokenizer: Any, written: Path) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "Hi!"}],
        },
        {"role": "assistant", "content": "Yo"},
        {"role": "tool", "content": "42"},
    ]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=template(written)
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>Hi!<|im_end|>\n"
        "<|im_start|>assistant\nYo<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with pytest.raises(TemplateError, match="roles"):
        tokenizer.apply_chat_template(
            [{"role": "narrator", "content": "x"}], tokenize=False, chat_template=template(written)
        )
