"""The engines take every id from the release: a release whose ids all differ still runs.

A release built with another vocabulary layout (every special and role id moved, a
larger vocabulary) goes through the three engines; the ids the thinker feeds are what
the release's own chat template renders for the same conversation, and its text deltas
join to the tokenizer's decoding of its tokens. A tokenizer file or config that does not
agree is refused with the file named.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
from tiny_omni_ids import TINY_TALKER

pytest.importorskip("transformers")

import torch
from tiny_omni_reference import audio_clip
from transformers import AutoTokenizer

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD, Fields
from omni_actors.actors.engines.qwen3_omni import configs, layout, weights
from omni_actors.actors.engines.qwen3_omni.code2wav_engine import Code2WavArgs, Code2WavEngine
from omni_actors.actors.engines.qwen3_omni.detokenizer import Detokenizer
from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs, TalkerEngine
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.actors.engines.qwen3_omni.tokenizer import TinyVocab
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.errors import ModelFileError

pytestmark = pytest.mark.integration

SHIFTED = TinyVocab(shift=100, size=420)
"""Every id past the bytes 100 higher than tiny-omni's, 132 more ids."""
SYSTEM = "Be brief, assistant."
FIRST = "Hi! The user says: system, assistant, user."
SECOND = "And then?"


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shifted") / "release"
    weights.build(out, 0, vocab=SHIFTED)
    return out


@pytest.fixture(scope="module")
def tokenizer(release: Path) -> Any:
    """The release's tokenizer and chat template as transformers alone loads them."""
    loaded = AutoTokenizer.from_pretrained(release, local_files_only=True)
    template = json.loads((release / "chat_template.json").read_text())["chat_template"]
    loaded.chat_template = template
    return loaded


async def feed(items: Iterable[Fields]) -> AsyncIterator[Fields]:
    for item in items:
        yield item


async def run(engine: Any, session: str, items: Iterable[Fields]) -> list[Fields]:
    return [out async for out in engine.generate(session, feed(items))]


def rendered(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


def expand_audio(ids: list[int], pad: int, n: int) -> list[int]:
    """The template's one audio placeholder made ``n``, as the processor expands it."""
    at = ids.index(pad)
    return [*ids[:at], *[pad] * n, *ids[at + 1 :]]


def test_the_shifted_release_moves_every_id_and_the_vocabulary_size(release: Path) -> None:
    vocabulary, tiny = Vocabulary.load(release), TinyVocab()
    config = json.loads((release / "config.json").read_text())
    assert config["thinker_config"]["text_config"]["vocab_size"] == vocabulary.size == 420
    assert vocabulary.ids.im_start == tiny.id("<|im_start|>") + 100 == config["im_start_token_id"]
    for role in ("system", "user", "assistant"):
        assert getattr(vocabulary.ids, role) == tiny.id(role) + 100
    assert vocabulary.ids.audio_pad == config["thinker_config"]["audio_token_id"]
    assert vocabulary.ids.audio_end == SHIFTED.id("<|audio_end|>")
    assert vocabulary.ids.newline == 10


async def test_a_conversation_runs_through_the_three_engines_on_the_releases_ids(
    release: Path, tokenizer: Any
) -> None:
    """(a) it runs; (b) the thinker feeds the template's ids; (c) deltas join to decode."""
    fed: list[int] = []
    thinker = ThinkerEngine(ThinkerArgs(model=str(release), min_new_tokens=4, max_new_tokens=12))
    await thinker.start()
    try:
        model = thinker._model
        step = model.step

        def recorded(chunks: list[Any], **kwargs: Any) -> Any:
            for chunk in chunks:  # one session: the steps' chunks are its feed, in order
                fed.extend(chunk.work.payload.ids[chunk.offset : chunk.offset + chunk.length])
            return step(chunks, **kwargs)

        model.step = recorded  # type: ignore[method-assign]
        first = await run(
            thinker,
            "s",
            [{INSTRUCTIONS_FIELD: SYSTEM}, {"audio": audio_clip(0.5)}, {"text": FIRST}],
        )
        second = await run(thinker, "s", [{"text": SECOND}])
    finally:
        await thinker.stop()

    ids = [vocabulary_ids(out) for out in (first, second)]
    assert all(4 <= len(reply) <= 12 for reply in ids)
    pad = SHIFTED.id("<|audio_pad|>")
    user_one = [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": FIRST}]
    opening = rendered(
        tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_one}]
    )
    opening = expand_audio(opening, pad, fed.count(pad))
    assert fed.count(pad) > 0
    then = rendered(tokenizer, [{"role": "user", "content": SECOND}])
    im_end, newline = SHIFTED.id("<|im_end|>"), 10
    expected = [*opening, *ids[0], im_end, newline, *then, *ids[1]]
    assert fed in (expected, expected[:-1])  # a reply cut at its limit: its last token waits
    for outputs, reply in zip((first, second), ids, strict=True):
        text = "".join(str(out["text"]) for out in outputs if "text" in out)
        assert text == tokenizer.decode(reply, skip_special_tokens=True)

    talker = TalkerEngine(TalkerArgs(model=str(release), speaker="Aiden", **TINY_TALKER))
    await talker.start()
    try:
        assert talker.voices == ["aiden", "chelsie", "ethan"]
        frames = [out["codes"] for out in await run(talker, "s", first)]
    finally:
        await talker.stop()
    codes = torch.cat([f for f in frames if isinstance(f, torch.Tensor)])
    assert codes.shape == (2 * len(ids[0]), configs.DEFAULT_NUM_CODE_GROUPS)

    code2wav = Code2WavEngine(Code2WavArgs(model=str(release)))
    await code2wav.start()
    try:
        audio = [out["audio"] for out in await run(code2wav, "s", [{"codes": codes}])]
    finally:
        await code2wav.stop()
    samples = sum(a.numel() for a in audio if isinstance(a, torch.Tensor))
    assert samples >= codes.shape[0] * configs.SAMPLES_PER_FRAME - 555


def vocabulary_ids(outputs: list[Fields]) -> list[int]:
    return [
        int(out["token_ids"]) for out in outputs if isinstance(out.get("token_ids"), torch.Tensor)
    ]


def test_text_deltas_hold_back_an_incomplete_character(tokenizer: Any) -> None:
    """(c) Multi-byte characters split over byte tokens, special tokens among them."""
    ids = tokenizer.encode("héllo 🎉 user wörld", add_special_tokens=False)
    ids = [*ids[:3], SHIFTED.id("<|audio_pad|>"), *ids[3:], 0xF0, 0x9F]  # ends mid-character
    text = Detokenizer(tokenizer)
    deltas = [text.add(i) for i in ids]
    assert deltas[1] == ""
    assert deltas[2] == "é"
    assert deltas[-2:] == ["", ""]
    rest = text.flush()
    assert rest == "\ufffd"
    assert "".join(deltas) + rest == tokenizer.decode(ids, skip_special_tokens=True)


@pytest.fixture
def copy(release: Path, tmp_path: Path) -> Path:
    out = tmp_path / "release"
    shutil.copytree(release, out)
    return out


def _edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _unlink(*paths: Path) -> None:
    for path in paths:
        path.unlink()


def _no_template(path: Path) -> None:
    """No chat template anywhere: neither its file nor ``tokenizer_config.json``'s key."""
    path.unlink()
    config = path.parent / "tokenizer_config.json"
    data = json.loads(config.read_text())
    del data["chat_template"]
    config.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("name", "damage", "problem"),
    [
        ("tokenizer.json", lambda p: _unlink(p, p.parent / "vocab.json"), "is missing"),
        ("tokenizer.json", lambda p: p.write_bytes(p.read_bytes()[:500]), "no valid tokenizer"),
        ("vocab.json", lambda p: p.write_text('{"a": "b"}'), "something else than an id"),
        ("merges.txt", lambda p: p.write_text("#version: 0.2\nu s e\n"), "line 2"),
        ("chat_template.json", lambda p: _no_template(p), "is missing"),
        ("chat_template.json", lambda p: p.write_text("{}"), "no chat_template"),
        (
            "config.json",
            lambda p: _edit_json(p, user_token_id=SHIFTED.id("system")),
            "user_token_id",
        ),
        ("config.json", lambda p: _edit_json(p, im_start_token_id=300), "im_start_token_id"),
        ("config.json", lambda p: _edit_json(p, tts_bos_token_id=None), "tts_bos_token_id"),
    ],
)
def test_a_tokenizer_or_config_that_disagrees_is_named(
    copy: Path, name: str, damage: Any, problem: str
) -> None:
    """(d)"""
    damage(copy / name)
    with pytest.raises(ModelFileError, match=problem) as info:
        Vocabulary.load(copy)
    assert info.value.path == copy / name


def test_a_release_without_tokenizer_json_builds_it_from_the_bpe_files(
    release: Path, copy: Path
) -> None:
    """Qwen publishes ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json``, which
    transformers builds its tokenizer from; a release without ``tokenizer.json`` loads and
    encodes as the same release with it."""
    (copy / "tokenizer.json").unlink()
    layout.verify(copy)  # the model cache's check before it hands a directory out
    built, whole = Vocabulary.load(copy), Vocabulary.load(release)
    assert built.ids == whole.ids
    assert built.size == whole.size
    for text in (SYSTEM, FIRST, "héllo 日本語 🎉\n\t<|im_end|> e\u0301"):
        assert built.encode(text) == whole.encode(text)
        assert built.decode(whole.encode(text)) == whole.decode(whole.encode(text))
    assert built.text_ids() == whole.text_ids()


def test_a_chat_template_that_renders_other_role_ids_is_named(copy: Path) -> None:
    """The old tiny-omni template wrote roles as special tokens the config does not name."""
    path = copy / "chat_template.json"
    template = json.loads(path.read_text())["chat_template"]
    path.write_text(
        json.dumps(
            {
                "chat_template": template.replace(
                    "'<|im_start|>' + message.role", "'<|im_start|><|' + message.role + '|>'"
                )
            }
        )
    )
    with pytest.raises(ModelFileError, match="renders a system turn") as info:
        Vocabulary.load(copy)
    assert info.value.path == path
