"""``ReplyInput``: what the thinker has sent the talker in one response so far.

The thinker -> talker contract (:mod:`~omni_actors.actors.engines.thinker_ports`),
checked where it is read: ``user`` [n, H] with its ``user_mask`` [n] bool (rows of user
turns, before or with the first token), and with them or alone ``user_edits`` [k]
(rows joining, ``+n``, and the last rows sent taken back, ``-m``; without it every row
joins), ``opening`` [3, H] and ``tts`` [3, H] with the first token, ``embed`` [n, H]
one row per token. Any subset per chunk, so a ``stream`` edge (one output per chunk)
and a ``full`` edge (one chunk, per-token fields and edits concatenated) read the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD
from omni_actors.errors import EngineError

__all__ = ["ReplyInput", "TalkerInputError"]


class TalkerInputError(EngineError, ValueError):
    """The talker's input breaks the thinker -> talker contract, or names an unknown voice."""


@dataclass
class ReplyInput:
    """What the thinker has sent in one response so far (see the module docstring)."""

    user: list[torch.Tensor] = field(default_factory=list)
    """[n, H] user rows not prefilled yet, in order."""
    user_mask: list[torch.Tensor] = field(default_factory=list)
    opening: torch.Tensor | None = None
    tts: torch.Tensor | None = None
    embeds: list[torch.Tensor] = field(default_factory=list)
    """[1, H] per token, in order."""
    ended: bool = False
    held: int = 0
    """User rows taken in this response and not taken back (prefilled or not)."""
    dropped: int = 0
    """Rows prefilled in this response that were taken back since: the prefill's
    user part is to lose its last ``dropped`` rows before the next one."""

    def take(self, fields: Fields) -> None:
        """Keep one input chunk's fields.

        Raises:
            TalkerInputError: user rows without their mask, or after the first token.
        """
        user = fields.get("user")
        edits = _edits(fields.get(USER_EDITS_FIELD))
        has_rows = isinstance(user, torch.Tensor) and user.numel() > 0
        if (has_rows or edits) and self.embeds:
            raise TalkerInputError(
                "talker got user rows after the reply's first token: the thinker "
                "sends a turn's rows before, or with, the first token"
            )
        rows, mask = torch.zeros(0, 0), torch.zeros(0, dtype=torch.bool)
        if isinstance(user, torch.Tensor) and has_rows:
            sent_mask = fields.get("user_mask")
            if not isinstance(sent_mask, torch.Tensor) or sent_mask.shape != user.shape[:1]:
                raise TalkerInputError(
                    f"talker got user rows {tuple(user.shape)} without a user_mask of "
                    f"{user.shape[0]} bools: the thinker -> talker edge must carry both"
                )
            rows, mask = user, sent_mask.to(torch.bool)
        count = rows.shape[0]
        if edits is None:
            edits = [count] if count else []
        elif sum(n for n in edits if n > 0) != count:
            raise TalkerInputError(
                f"talker got {count} user rows with user_edits {edits}: the edits' "
                "positive counts must add up to the rows sent with them"
            )
        at = 0
        for n in edits:
            if n > 0:
                self.user.append(rows[at : at + n])
                self.user_mask.append(mask[at : at + n])
                self.held += n
                at += n
            elif n < 0:
                self._take_back(-n)
        for name in ("opening", "tts"):
            value = fields.get(name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value)
        embed = fields.get("embed")
        if isinstance(embed, torch.Tensor) and embed.numel():
            self.embeds.extend(torch.split(embed.reshape(-1, embed.shape[-1]), 1))

    def _take_back(self, count: int) -> None:
        """The last ``count`` rows taken go: those not prefilled yet first."""
        if count > self.held:
            raise TalkerInputError(
                f"talker was told to take back {count} user rows, but holds {self.held} "
                "sent in this response: the thinker takes back only rows it sent in it"
            )
        self.held -= count
        while count and self.user:
            last = self.user[-1].shape[0]
            if last <= count:
                self.user.pop()
                self.user_mask.pop()
                count -= last
            else:
                self.user[-1] = self.user[-1][: last - count]
                self.user_mask[-1] = self.user_mask[-1][: last - count]
                count = 0
        self.dropped += count

    def take_dropped(self) -> int:
        """The prefilled rows taken back since the last call, now handed to the model."""
        dropped, self.dropped = self.dropped, 0
        return dropped

    def take_user(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The user rows not prefilled yet ([n, H], [n] bool), now handed to a prefill."""
        if not self.user:
            return torch.zeros(0, 0), torch.zeros(0, dtype=torch.bool)
        rows, mask = torch.cat(self.user), torch.cat(self.user_mask)
        self.user, self.user_mask = [], []
        return rows, mask

    def known(self, frame: int) -> bool:
        """Whether frame ``frame``'s text input can be told yet."""
        return self.ended or frame < len(self.embeds)

    def text(self, frame: int) -> torch.Tensor:
        """Frame ``frame``'s text input [1, H]: its token, then TTS_EOS once, then TTS_PAD."""
        if frame < len(self.embeds):
            return self.embeds[frame]
        assert self.tts is not None, "checked before the first frame"
        return self.tts[1:2] if frame == len(self.embeds) else self.tts[2:3]


def _edits(value: object) -> list[int] | None:
    """``user_edits`` as a list (None when absent).

    Raises:
        TalkerInputError: it is not a 1-D integer tensor.
    """
    if value is None:
        return None
    if (
        not isinstance(value, torch.Tensor)
        or value.dim() != 1
        or value.dtype.is_floating_point
        or value.dtype == torch.bool
    ):
        raise TalkerInputError(
            f"talker got {USER_EDITS_FIELD!r} that is not a 1-D integer tensor of row counts"
        )
    return [int(n) for n in value.tolist()]
