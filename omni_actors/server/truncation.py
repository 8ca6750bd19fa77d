"""``RetentionRatio``: ``truncation: {"type": "retention_ratio"}``, which oldest turns go.

OpenAI's definition: when the conversation after the instructions passes its token
limit (``token_limits.post_instructions``), the oldest messages are dropped until
``retention_ratio`` of the limit is used, so that truncations come seldom (each one
costs a prefill of what is kept).

The server counts no tokens itself: each response's usage (the entry engine's count of
the context its reply came from, plus the reply) is the conversation's size through
that reply (:class:`ConversationTokens`). What the turns after a reply cost is the
difference of two such counts, in which the instructions cancel out; the limit is
compared with the last count, instructions included, so a truncation comes a little
early rather than late. The turns are dropped whole, through the end of a reply.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConversationTokens", "RetentionRatio"]


@dataclass(frozen=True, slots=True)
class RetentionRatio:
    """Past ``post_instructions`` tokens, keep ``ratio`` of them (the newest turns)."""

    ratio: float
    post_instructions: int

    @property
    def kept(self) -> float:
        """The tokens a truncation keeps at most."""
        return self.ratio * self.post_instructions


class ConversationTokens:
    """The conversation's size through each reply, from the responses' usage."""

    def __init__(self) -> None:
        self._marks: list[tuple[str, int]] = []  # (reply item, tokens through it), in order

    def measured(self, item_id: str, tokens: int) -> None:
        """The conversation through the reply in ``item_id`` is ``tokens`` long."""
        self._marks.append((item_id, tokens))

    def forget(self, item_ids: set[str]) -> None:
        """These items left the conversation."""
        self._marks = [mark for mark in self._marks if mark[0] not in item_ids]

    def cut(self, retention: RetentionRatio) -> str | None:
        """The reply through which the oldest turns go, so that what stays fits
        ``retention.kept``; None while the last count is within the limit. The last
        exchange always stays."""
        if len(self._marks) < 2:
            return None
        last = self._marks[-1][1]
        if last <= retention.post_instructions:
            return None
        for item_id, tokens in self._marks[:-1]:
            if last - tokens <= retention.kept:
                return item_id
        return self._marks[-2][0]
