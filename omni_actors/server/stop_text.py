"""``StopText``: a reply's text cut at the first of its ``stop`` strings, as it streams.

Chat completions' ``stop`` ends a reply where its text first contains one of the
strings, the string itself left out. The text arrives token by token and a stop
string may span tokens, so a piece that could be the start of one is held back until
the next piece says whether it is; nothing past a stop string is ever handed out.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopText"]


class StopText:
    """Feed it the reply's text pieces; it hands out what precedes the first stop string.

    Args:
        stops: the stop strings (non-empty ones; none: the text passes as it comes).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.stopped = False
        """A stop string was found: the reply ends here."""
        self._held = ""

    def feed(self, text: str) -> str:
        """The part of the text so far that can be handed out now ("" once stopped)."""
        if self.stopped:
            return ""
        text = self._held + text
        cut = self._first(text)
        # A longer stop string may still begin before the one found: wait for it.
        start = len(text) - self._partial(text)
        if cut >= 0 and cut <= start:
            self.stopped = True
            self._held = ""
            return text[:cut]
        self._held = text[start:]
        return text[:start]

    def flush(self) -> str:
        """What is still held, at the reply's end, up to a stop string it holds."""
        held, self._held = self._held, ""
        if self.stopped:
            return ""
        cut = self._first(held)
        if cut >= 0:
            self.stopped = True
            return held[:cut]
        return held

    def _first(self, text: str) -> int:
        """Where the first stop string in ``text`` begins; -1 if none does."""
        return min((i for s in self.stops if (i := text.find(s)) >= 0), default=-1)

    def _partial(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
