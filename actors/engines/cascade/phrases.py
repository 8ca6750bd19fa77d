"""``PhrasePolicy``: where a synthesizer cuts the text an LLM streams to it.

The text chunk policy of the LLM -> synthesizer edge (the ``ChunkPolicy`` of codec
frames has the same job on the synthesizer -> codec edge): the first phrase ends early,
at a clause mark or after ``first_words`` words, so the first audio starts while the
LLM still writes; every later phrase is a sentence (or ``max_words`` words, whichever
comes first), which a synthesizer speaks with better prosody than a fragment.

An ASCII mark or a word ends a phrase only once whitespace follows it: streamed text
may go on right after it ("3." of "3.50", "two" of "twofold"). Chinese and Japanese
write no whitespace after their full-width marks (sentence ``。`` ``！`` ``？``, clause
``，`` ``、`` ``；`` ``：``): such a mark ends a phrase once any character follows it
but another mark or a closing quote or bracket (``」`` ``』`` ``”`` ``）`` ...), which
stays with the phrase it closes. Text written without spaces (Chinese, Japanese, Thai; a
toy model's random letters) has no words to count: a run of ``CHARS_PER_WORD``
characters per word of the limit with no whitespace in it ends the phrase right there,
so a phrase without marks too is spoken after a few words' worth of text rather than at
the reply's end. :func:`spoken_words` measures a phrase the same way.

Guarantees: the phrases, joined, are the text (whitespace between phrases aside); no
phrase is empty; :meth:`PhrasePolicy.flush` gives what is left once the text ends.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Final

__all__ = ["CHARS_PER_WORD", "PhrasePolicy", "spoken_words"]

CHARS_PER_WORD: Final = 6
"""Characters that count as a word where text has no whitespace: an English word and
its space, about (4.7 letters a word)."""

_CLOSERS: Final = "\"')\\]\u2019\u201d\u3009\u300b\u300d\u300f\u3011\uff09"
"""What closes a quote or a bracket after a mark, and stays with it: ASCII, curly
quotes, and the full-width brackets (``〉`` ``》`` ``」`` ``』`` ``】`` ``）``)."""

_FULL_STOPS: Final = "\u3002\uff01\uff1f"  # 。！？
_FULL_PAUSES: Final = "\u3001\uff0c\uff1b\uff1a"  # 、，；：


def _mark(ascii_marks: str, full_marks: str) -> re.Pattern[str]:
    """Where a run of these marks ends a phrase: ASCII marks (and the closers after
    them) once whitespace follows, full-width ones once anything but a mark or a closer
    follows (module docstring). The full-width run takes every mark and closer there is
    (possessive: ``*+``), so a run the text has not gone past yet ends nothing."""
    return re.compile(
        rf"[{ascii_marks}]+[{_CLOSERS}]*(?=\s)"
        rf"|[{full_marks}][{ascii_marks}{full_marks}]*+[{_CLOSERS}]*+(?=.)",
        re.DOTALL,
    )


_SENTENCE: Final = _mark(r".!?", _FULL_STOPS)
_CLAUSE: Final = _mark(",;:\u2014", _FULL_PAUSES)


@dataclass
class PhrasePolicy:
    """Cuts streamed text into phrases (module docstring).

    Args:
        first_words: the first phrase ends after this many words, if no clause or
            sentence mark came before.
        max_words: a later phrase ends after this many words without a sentence mark.
    """

    first_words: int = 4
    max_words: int = 30
    _text: str = ""
    _cut: int = field(default=0)

    def __post_init__(self) -> None:
        if self.first_words < 1 or self.max_words < 1:
            raise ValueError(
                f"first_words and max_words must be >= 1, got {self.first_words}, {self.max_words}"
            )

    def push(self, text: str) -> list[str]:
        """Add ``text``; the phrases it completes, in order."""
        self._text += text
        phrases = []
        while (phrase := self._next()) is not None:
            phrases.append(phrase)
        return phrases

    def flush(self) -> str | None:
        """What is left once the text ended (None: nothing)."""
        rest, self._text = self._text.strip(), ""
        if rest:
            self._cut += 1
        return rest or None

    def _next(self) -> str | None:
        text = self._text
        first = self._cut == 0
        marks = [_SENTENCE] + ([_CLAUSE] if first else [])
        ends = [m.end() for mark in marks if (m := mark.search(text)) is not None]
        limit = self.first_words if first else self.max_words
        words = list(re.finditer(r"\S+(?=\s)", text))
        if len(words) >= limit:
            ends.append(words[limit - 1].end())
        run = re.search(rf"\S{{{limit * CHARS_PER_WORD}}}", text)
        if run is not None:  # no whitespace to cut at: cut by length
            ends.append(run.end())
        if not ends:
            return None
        end = min(ends)
        phrase, self._text = text[:end].strip(), text[end:]
        if not phrase:
            return None
        self._cut += 1
        return phrase


def spoken_words(phrase: str) -> int:
    """How many words ``phrase`` speaks, about: each of its words, a word of over
    :data:`CHARS_PER_WORD` characters (or a run of text written without spaces) one per
    ``CHARS_PER_WORD`` characters begun; at least 1."""
    return max(1, sum(math.ceil(len(word) / CHARS_PER_WORD) for word in phrase.split()))
