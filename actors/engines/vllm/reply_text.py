"""``ReplyText``: a reply's text token by token, decoded with the model's tokenizer.

The engine decodes itself rather than take vLLM's text: vLLM's detokenizer follows the
request, and a conversation's request also generates the tokens of prefill chunks,
which are dropped.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReplyText"]


class ReplyText:
    """What each token of a reply adds to its text, once that text decodes whole.

    A character may span tokens (a byte-level vocabulary splits UTF-8): a token that
    ends inside one adds nothing until the token that completes it.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.sent = 0

    def add(self, token: int) -> str:
        """The text ``token`` completes ("" while a character is incomplete)."""
        self.tokens.append(token)
        text: str = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        new, self.sent = text[self.sent :], len(text)
        return new
