"""``Detokenizer``: a reply's text, delta by delta, as its tokens are generated.

A byte-level BPE token is a run of bytes, not of characters: a character of several
UTF-8 bytes may span tokens, and a token decoded alone may end in the middle of one. So
each token's text is what decoding the reply so far adds, and text that ends in an
incomplete character (decoded as ``U+FFFD``) is held back until the next token
completes it. The deltas then concatenate to ``tokenizer.decode`` of the whole reply,
special tokens skipped, as a client that reassembles them expects.

Decoding the whole reply at every token would cost its length squared; only the tokens
since the last delta that ended cleanly are decoded again (with those of the delta
before, as context for decoders that look back), as vLLM's detokenizer does.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["Detokenizer"]

_INCOMPLETE: Final = "\ufffd"
"""What the decoder makes of bytes that do not (yet) form a character."""


class Detokenizer:
    """One reply's incremental decoding (module docstring).

    Args:
        tokenizer: a ``transformers`` tokenizer (its ``decode``).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        """Start of the tokens decoded for context."""
        self._read = 0
        """End of the tokens whose text was handed out."""

    def _decode(self, ids: list[int]) -> str:
        text: str = self._tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        return text

    def add(self, token: int) -> str:
        """The text ``token`` adds to the reply; ``""`` while a character is incomplete."""
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(before) or text.endswith(_INCOMPLETE):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before) :]

    def flush(self) -> str:
        """The text held back at the reply's end (bytes that never became a character
        decode to ``U+FFFD``, as in ``decode`` of the whole reply); ``""`` if none."""
        before = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(before) :]
