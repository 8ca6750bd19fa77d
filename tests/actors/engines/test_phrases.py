"""``PhrasePolicy``: the text chunk policy of the LLM -> synthesizer edge."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_actors.actors.engines.cascade.phrases import CHARS_PER_WORD, PhrasePolicy, spoken_words


def _cut(policy: PhrasePolicy, pieces: list[str]) -> list[str]:
    phrases = [p for piece in pieces for p in policy.push(piece)]
    rest = policy.flush()
    return [*phrases, *([rest] if rest else [])]


def test_first_phrase_ends_early_then_sentences() -> None:
    policy = PhrasePolicy(first_words=3, max_words=30)
    tokens = "Well, I think that is a fine idea. Let us go there now! Fine"
    pieces = [c for c in tokens]  # streamed character by character, as an LLM writes
    assert _cut(policy, pieces) == [
        "Well,",
        "I think that is a fine idea.",
        "Let us go there now!",
        "Fine",
    ]


def test_first_phrase_after_first_words_without_a_mark() -> None:
    policy = PhrasePolicy(first_words=2, max_words=4)
    assert policy.push("one two") == []  # "two" may go on ("twofold")
    assert policy.push(" three four five six seven") == ["one two", "three four five six"]
    assert policy.flush() == "seven"
    assert policy.flush() is None


def test_a_phrase_is_never_cut_inside_a_number_or_an_abbreviation_mark() -> None:
    policy = PhrasePolicy(first_words=10)
    assert policy.push("It costs 3.50 dollars") == []
    assert policy.push(". Yes") == ["It costs 3.50 dollars."]


def test_text_without_spaces_is_cut_by_its_length() -> None:
    # Chinese or Thai, or a toy model's random letters: no word ends, yet the first
    # phrase is spoken after first_words words' worth of text, not at the reply's end.
    policy = PhrasePolicy(first_words=3, max_words=4)
    first, later = 3 * CHARS_PER_WORD, 4 * CHARS_PER_WORD
    text = "".join(chr(ord("a") + n % 26) for n in range(first + 2 * later + 5))
    cuts = [(n, phrase) for n, c in enumerate(text) for phrase in policy.push(c)]
    ends = [first, first + later, first + 2 * later]
    assert cuts == [
        (end - 1, text[start:end]) for start, end in zip([0, *ends[:-1]], ends, strict=True)
    ]
    assert policy.flush() == text[first + 2 * later :]


def test_a_long_word_shorter_than_the_limits_characters_is_not_cut() -> None:
    # 20 characters, below 4 x CHARS_PER_WORD: only a longer run is cut by length.
    policy = PhrasePolicy(first_words=4)
    assert policy.push("Internationalization matters a lot") == []
    assert policy.push(" here") == ["Internationalization matters a lot"]


def test_spoken_words_count_text_without_spaces_by_length() -> None:
    assert spoken_words("Hello there, my friend") == 4
    assert spoken_words("x" * (2 * CHARS_PER_WORD + 1)) == 3
    assert spoken_words("Internationalization") == 4
    assert spoken_words("") == 1


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="first_words"):
        PhrasePolicy(first_words=0)


@given(
    st.lists(st.text(alphabet="ab ,.!?", max_size=12), max_size=12),
    st.integers(1, 5),
    st.integers(1, 8),
)
def test_phrases_join_to_the_text(pieces: list[str], first: int, most: int) -> None:
    phrases = _cut(PhrasePolicy(first, most), pieces)
    text = "".join(pieces)
    assert all(p and p == p.strip() for p in phrases)
    assert "".join("".join(phrases).split()) == "".join(text.split())
    if max(map(len, text.split()), default=0) < min(first, most) * CHARS_PER_WORD:
        assert " ".join(phrases).split() == text.split()  # cut only where words end
