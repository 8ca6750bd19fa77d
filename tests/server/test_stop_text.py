"""``StopText``: however the text is split into pieces, what it hands out is the text
before the first stop string, and nothing past it."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import example, given
from hypothesis import strategies as st

from omni_actors.server.stop_text import StopText

ALPHABET = "ab "


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """The text before the first stop string (a plain search of the whole text)."""
    cuts = [i for s in stops if s and (i := text.find(s)) >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
@example(text="abc", stops=["abc", "b"], cuts=[2])  # the longer one begins first
def test_pieces_add_up_to_the_text_before_the_first_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in pairwise(bounds)]
    stop = StopText(stops)
    out = "".join(stop.feed(p) for p in pieces)
    out += stop.flush()
    assert (out, stop.stopped) == reference(text, stops)


def test_a_possible_start_is_held_until_the_next_piece() -> None:
    stop = StopText(["END"])
    assert stop.feed("the E") == "the "
    assert stop.feed("ND and more") == ""
    assert stop.stopped
    assert stop.feed("later") == ""
    assert stop.flush() == ""


def test_without_stops_text_passes_as_it_comes() -> None:
    stop = StopText([])
    assert stop.feed("abc") == "abc"
    assert stop.flush() == ""
    assert not stop.stopped
