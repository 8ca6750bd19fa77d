"""``Refusals``: what a node refused off the wire, counted, and logged without flooding.

Frames that reach a node's inbox are input like any other: a frame that is malformed,
from a process that is not a peer, replayed, or granting credits it cannot grant is
dropped — never handled, never raised into the event loop — and counted here by reason.
A hostile sender can send millions, so the log says each reason the first time and then
only at each power of two of its count: a bounded number of lines, each with the total.
"""

from __future__ import annotations

import logging
from collections import Counter

__all__ = ["Refusals"]

log = logging.getLogger("omni_actors.transport.node")


class Refusals:
    """Counts of refused frames by reason for one node (reasons are a fixed set)."""

    __slots__ = ("counts", "node_id")

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.counts: Counter[str] = Counter()

    def refuse(self, reason: str, detail: object = "") -> None:
        """Count one refused frame; log it if its count is 1, 2, 4, 8, ...

        Args:
            reason: a short fixed phrase (it is the counter's key, so never put values
                from the frame in it: those go in ``detail``).
            detail: what was wrong with this frame, for the log line.
        """
        count = self.counts[reason] + 1
        self.counts[reason] = count
        if count & (count - 1) == 0:
            log.warning(
                "node %d refused a frame (%s, %d so far): %s", self.node_id, reason, count, detail
            )

    @property
    def total(self) -> int:
        """Frames refused so far, all reasons together."""
        return self.counts.total()
