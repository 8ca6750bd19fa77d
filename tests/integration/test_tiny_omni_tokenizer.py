"""tiny-omni's tokenizer files load with ``AutoTokenizer`` and tokenize like the engines.

The engines tokenize with :func:`configs.encode_text` (UTF-8 bytes) and lay prompts out
with :class:`configs.Tokens`; a server loading the model directory the standard way must
get the very same ids, or the thinker would see another language.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from jinja2 import TemplateError
from transformers import AutoTokenizer

from omni_actors.actors.engines.qwen3_omni import configs
from omni_actors.actors.engines.qwen3_omni.configs import Tokens
from omni_actors.actors.engines.qwen3_omni.tokenizer import (
    SPECIAL_TOKENS,
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


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-omni-tokenizer")
    write_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(written: Path) -> Any:
    return AutoTokenizer.from_pretrained(written, local_files_only=True)


@pytest.mark.integration
def test_files_are_the_hf_layout_and_deterministic(written: Path, tmp_path: Path) -> None:
    names = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert names <= {p.name for p in written.iterdir()}
    write_tokenizer(tmp_path)
    for name in names:
        assert (tmp_path / name).read_bytes() == (written / name).read_bytes(), name
    config = json.loads((written / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    assert config["bos_token"] is None


@pytest.mark.integration
@pytest.mark.parametrize("text", TEXTS)
def test_text_encodes_to_its_utf8_bytes(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids == configs.encode_text(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer(text)["input_ids"] == ids  # no BOS/EOS added


@pytest.mark.integration
def test_special_tokens_have_tiny_omni_ids(tokenizer: Any) -> None:
    thinker: Any = configs.tiny_configs(0).thinker_config
    vocab_size = thinker.text_config.vocab_size
    assert len(tokenizer) == vocab_size  # every id the thinker can emit decodes
    for token_id, text in SPECIAL_TOKENS.items():
        assert tokenizer.convert_tokens_to_ids(text) == token_id
        assert tokenizer.encode(text) == [token_id]
    assert tokenizer.eos_token_id == Tokens.IM_END
    assert tokenizer.pad_token_id == Tokens.END_OF_TEXT
    assert tokenizer.bos_token is None
    assert set(range(256, vocab_size)) <= set(tokenizer.all_special_ids)
    assert not set(range(256)) & set(tokenizer.all_special_ids)
    assert tokenizer.convert_tokens_to_ids(tokenizer.audio_token) == Tokens.AUDIO_PAD
    assert tokenizer.convert_tokens_to_ids(tokenizer.image_token) == Tokens.IMAGE_PAD
    # Byte tokens are the GPT-2 byte-level symbols, in byte order.
    assert tokenizer.convert_ids_to_tokens(list(range(256))) == byte_symbols()
    # Typed in text, a special token's string is the special token (as in any HF tokenizer);
    # split_special_tokens gives its bytes, as encode_text does.
    assert tokenizer.encode("<|im_end|>", split_special_tokens=True) == configs.encode_text(
        "<|im_end|>"
    )


@pytest.mark.integration
def test_decode_skipping_specials_equals_decode_text(tokenizer: Any) -> None:
    ids = [Tokens.IM_START, 72, 195, 40, Tokens.AUDIO_PAD, 240, 159, 287, 105, Tokens.IM_END, 10]
    assert tokenizer.decode(ids, skip_special_tokens=True) == configs.decode_text(ids)


@pytest.mark.integration
def test_chat_template_gives_the_thinker_prompt_layout(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "Hi!"}],
        },
    ]
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    system = [
        Tokens.IM_START,
        Tokens.SYSTEM,
        10,
        *configs.encode_text("Be brief."),
        Tokens.IM_END,
        10,
    ]
    user = [
        Tokens.IM_START,
        Tokens.USER,
        10,
        Tokens.AUDIO_START,
        Tokens.AUDIO_PAD,
        Tokens.AUDIO_END,
    ]
    user += [*configs.encode_text("Hi!"), Tokens.IM_END, 10]
    assert ids == [*system, *user, Tokens.IM_START, Tokens.ASSISTANT, 10]
    text = tokenizer.apply_chat_template(messages[:1], tokenize=False)
    assert text == "<|im_start|><|system|>\nBe brief.<|im_end|>\n"
    with pytest.raises(TemplateError, match="roles"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)
