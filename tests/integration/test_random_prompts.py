"""Random prompts of an exact length: every prompt encodes, as the thinker encodes a
text chunk, to exactly the tokens asked for, with tiny-omni's vocabulary and with one
whose fillers no text encodes to; the same seed gives the same prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_actors.actors.engines.qwen3_omni import weights
from omni_actors.actors.engines.qwen3_omni.tokenizer import TinyVocab
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.bench.random_prompts import PromptLengthError, RandomPrompts, entry_vocabulary
from omni_actors.models.cache import locate, prepare
from omni_actors.pipeline.spec.pipeline import load_pipeline

pytestmark = pytest.mark.integration

LENGTHS = (1, 2, 3, 17, 256, 2500)
SHIFTED = TinyVocab(shift=100, size=420)
"""100 filler tokens (``<fill0>``...) after the bytes, as a generated full-size release
has 150,000: their text encodes to several byte tokens, never back to them."""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-omni", cache_dir=root)
    return root


@pytest.fixture(scope="module")
def tiny(cache: Path) -> Vocabulary:
    return Vocabulary.load(locate("tiny-omni", cache_dir=cache))


@pytest.fixture(scope="module")
def shifted(tmp_path_factory: pytest.TempPathFactory) -> Vocabulary:
    out = tmp_path_factory.mktemp("shifted") / "release"
    weights.build(out, 0, vocab=SHIFTED)
    return Vocabulary.load(out)


@pytest.mark.parametrize("which", ["tiny", "shifted"])
@pytest.mark.parametrize("tokens", LENGTHS)
def test_every_prompt_is_exactly_the_tokens_asked_for(
    which: str, tokens: int, request: pytest.FixtureRequest
) -> None:
    vocabulary: Vocabulary = request.getfixturevalue(which)
    prompts = RandomPrompts(vocabulary, tokens, seed=7)

    texts = prompts.texts(12)

    assert [len(vocabulary.encode(text)) for text in texts] == [tokens] * 12
    if tokens >= 3:  # a few hundred ids: one or two ids may repeat by chance
        assert len(set(texts)) == 12


def test_the_same_seed_gives_the_same_prompts(tiny: Vocabulary) -> None:
    a, b = RandomPrompts(tiny, 64, seed=1), RandomPrompts(tiny, 64, seed=1)

    assert a.texts(5) == b.texts(5)
    assert a.text(3) == b.texts(5)[3]  # prompt i does not depend on the others drawn
    assert RandomPrompts(tiny, 64, seed=2).texts(5) != a.texts(5)


def test_text_ids_are_tokens_that_encode_back_to_themselves(shifted: Vocabulary) -> None:
    ids = shifted.text_ids()
    fillers = {SHIFTED.vocab[f"<fill{i}>"] for i in range(SHIFTED.shift)}
    specials = set(SHIFTED.specials)

    assert ids
    assert not (set(ids) & (fillers | specials))
    assert all(shifted.encode(shifted.decode([i])) == [i] for i in ids)
    assert SHIFTED.id("user") in ids  # a merged token is text
    assert ord("a") in ids


def test_the_entry_stage_of_a_model_preset_gives_its_release_vocabulary(
    cache: Path, tiny: Vocabulary
) -> None:
    spec = load_pipeline("tiny-omni").with_weights(cache_dir=cache)

    assert entry_vocabulary(spec).text_ids() == tiny.text_ids()


def test_a_scripted_pipeline_has_no_tokenizer_and_lengths_start_at_one(tiny: Vocabulary) -> None:
    with pytest.raises(PromptLengthError, match="--input-tokens needs a model preset"):
        entry_vocabulary(load_pipeline("scripted-omni"))
    for bad in (0, -5):
        with pytest.raises(PromptLengthError, match="at least 1 token"):
            RandomPrompts(tiny, bad)
