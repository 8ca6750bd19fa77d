"""``RowsAhead``: the talker's rows of an open user turn, sent ahead of its commit.

A thinker that sends a user turn's rows as they become final (``user`` and
``user_mask`` with ``user_edits``, :mod:`~omni_actors.actors.engines.thinker_ports`)
counts the rows of the open turn the talker holds, so that it can take them back
within the same response: all of them when the turn is cleared, or when the rows
change (a truncation that feeds the turn again behind a shorter reply: its new rows
are sent in their place). Each engine keeps one per open turn; the counting and the
output it writes are the same for every thinker.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD

__all__ = ["RowsAhead"]


@dataclass
class RowsAhead:
    """The rows of the open turn the talker holds, and those it must let go."""

    sent: int = 0
    """Rows of the open turn the talker holds (sent by :meth:`output`)."""
    taken_back: int = 0
    """Rows the talker holds that are no longer the turn's: taken back with the next
    output."""

    def take_back(self) -> None:
        """Every row sent is to go (the turn was dropped, or its rows changed)."""
        self.taken_back, self.sent = self.taken_back + self.sent, 0

    def dropped(self) -> RowsAhead:
        """The count for the turn that follows a dropped one: this one's rows go with
        its first output."""
        return RowsAhead(taken_back=self.taken_back + self.sent)

    def output(
        self, user: torch.Tensor | None, mask: torch.Tensor | None
    ) -> dict[str, torch.Tensor | str] | None:
        """The output that sends ``user`` [n, H] (``user_mask`` [n]: ``mask``) after
        taking back what is to go; None if there is nothing to send.

        ``user_edits`` holds ``-m`` first when ``m`` rows the talker holds are to go,
        then ``+n`` for the rows sent.
        """
        edits = [-self.taken_back] if self.taken_back else []
        out: dict[str, torch.Tensor | str] = {}
        if user is not None and mask is not None and user.shape[0]:
            out["user"], out["user_mask"] = user, mask
            edits.append(user.shape[0])
            self.sent += user.shape[0]
        if not edits:
            return None
        out[USER_EDITS_FIELD] = torch.tensor(edits, dtype=torch.int64)
        self.taken_back = 0
        return out
