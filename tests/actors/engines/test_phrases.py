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


def _cuts(policy: PhrasePolicy, text: str) -> list[tuple[int, str]]:
    """Each phrase, streamed character by character, with the index of the character
    that completed it."""
    return [(n, phrase) for n, c in enumerate(text) for phrase in policy.push(c)]


def test_full_width_marks_end_a_phrase_without_whitespace() -> None:
    # Chinese: the first phrase at its clause mark, then sentences, each cut as the next
    # character comes (it might have been another mark, or a closing quote).
    policy = PhrasePolicy(first_words=3, max_words=30)
    text = "你好，我是一个模型。今天天气很好！你呢？"
    assert _cuts(policy, text) == [(3, "你好，"), (10, "我是一个模型。"), (17, "今天天气很好！")]
    assert policy.flush() == "你呢？"


@pytest.mark.parametrize("mark", ["，", "、", "；", "："])
def test_every_full_width_clause_mark_ends_the_first_phrase(mark: str) -> None:
    policy = PhrasePolicy(first_words=3, max_words=30)
    assert policy.push(f"注意{mark}") == []
    assert policy.push("这") == [f"注意{mark}"]
    # A later phrase is a sentence: a clause mark does not end it.
    assert policy.push(f"是一个{mark}例子。好") == [f"这是一个{mark}例子。"]


def test_full_width_marks_keep_their_runs_and_closing_quotes() -> None:
    # Japanese: the closing quote after a sentence's mark stays with it, and so do the
    # marks of one run ("？！"); an ASCII mark with no whitespace after it ends nothing.
    policy = PhrasePolicy(first_words=3, max_words=30)
    text = "はい、そうです。「ありがとう。」と言った？！版本3.5很好。"
    assert _cuts(policy, text) == [
        (3, "はい、"),
        (8, "そうです。"),
        (16, "「ありがとう。」"),
        (22, "と言った？！"),
    ]
    assert policy.flush() == "版本3.5很好。"


def test_a_closing_quote_after_an_ascii_clause_mark_stays_with_it() -> None:
    policy = PhrasePolicy(first_words=5)
    assert policy.push('"Yes," she') == ['"Yes,"']


def test_text_without_spaces_or_marks_is_still_cut_by_its_length() -> None:
    policy = PhrasePolicy(first_words=2, max_words=3)
    first, later = 2 * CHARS_PER_WORD, 3 * CHARS_PER_WORD
    text = "天" * (first + later) + "好。再见"
    assert _cuts(policy, text) == [
        (first - 1, "天" * first),
        (first + later - 1, "天" * later),
        (first + later + 2, "好。"),
    ]
    assert policy.flush() == "再见"


def test_spoken_words_count_text_without_spaces_by_length() -> None:
    assert spoken_words("Hello there, my friend") == 4
    assert spoken_words("x" * (2 * CHARS_PER_WORD + 1)) == 3
    assert spoken_words("Internationalization") == 4
    assert spoken_words("") == 1


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="first_words"):
        PhrasePolicy(first_words=0)


_STOPS, _PAUSES, _CLOSERS = ".!?。！？", ",;:，、；：", '")」』”）'
_FULL = "。！？，、；："


def _sentence_ends(phrase: str, marks: str) -> list[int]:
    """Where a run of ``marks`` (with the closers after it) ends inside ``phrase`` with
    more of the phrase after it that it should have been cut from: whitespace after an
    ASCII mark, anything but a mark or a closer after a full-width one."""
    ends = []
    for n, c in enumerate(phrase):
        if c not in marks or (n > 0 and phrase[n - 1] in marks):
            continue
        end = n
        while end < len(phrase) and phrase[end] in marks:
            end += 1
        full = any(m in _FULL for m in phrase[n:end])
        while end < len(phrase) and phrase[end] in _CLOSERS:
            end += 1
        if end < len(phrase) and (phrase[end].isspace() or full):
            ends.append(end)
    return ends


@given(
    st.lists(st.text(alphabet="ab ,.!?，。！？、；：」", max_size=12), max_size=12),
    st.integers(1, 5),
    st.integers(1, 8),
)
def test_phrases_join_to_the_text(pieces: list[str], first: int, most: int) -> None:
    phrases = _cut(PhrasePolicy(first, most), pieces)
    text = "".join(pieces)
    assert all(p and p == p.strip() for p in phrases)
    assert "".join("".join(phrases).split()) == "".join(text.split())
    # No phrase holds a sentence end it should have been cut at (a clause end in the
    # first phrase).
    for n, phrase in enumerate(phrases):
        assert not _sentence_ends(phrase, _STOPS + (_PAUSES if n == 0 else "")), phrases
    if max(map(len, text.split()), default=0) < min(first, most) * CHARS_PER_WORD:
        # Cut only where words end, or right after a full-width mark (and its closers).
        at = 0
        for phrase in phrases[:-1]:
            at = text.index(phrase, at) + len(phrase)
            marks = phrase.rstrip(_CLOSERS)
            marks = marks[len(marks.rstrip(_STOPS + _PAUSES)) :]
            assert text[at].isspace() or any(m in _FULL for m in marks), phrases
        if not any(c in _FULL for c in text):
            assert " ".join(phrases).split() == text.split()
