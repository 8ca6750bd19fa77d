"""``ReplyInput``: what the thinker has sent the talker in one response so far.

The thinker -> talker contract, checked where it is read: ``user`` [n, H] with its
``user_mask`` [n] bool (rows of committed user turns, before or with the first token),
``opening`` [3, H] and ``tts`` [3, H] with the first token, ``embed`` [n, H] one row per
token. Any subset per chunk, so a ``stream`` edge (one output per chunk) and a ``full``
edge (one chunk, per-token fields concatenated) read the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omni_actors.actors.engines.contract import Fields
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

    def take(self, fields: Fields) -> None:
        """Keep one input chunk's fields.

        Raises:
            TalkerInputError: user rows without their mask, or after the first token.
        """
        user = fields.get("user")
        if isinstance(user, torch.Tensor) and user.numel():
            mask = fields.get("user_mask")
            if not isinstance(mask, torch.Tensor) or mask.shape != user.shape[:1]:
                raise TalkerInputError(
                    f"talker got user rows {tuple(user.shape)} without a user_mask of "
                    f"{user.shape[0]} bools: the thinker -> talker edge must carry both"
                )
            if self.embeds:
                raise TalkerInputError(
                    "talker got user rows after the reply's first token: the thinker "
                    "sends a turn's rows before, or with, the first token"
                )
            self.user.append(user)
            self.user_mask.append(mask.to(torch.bool))
        for name in ("opening", "tts"):
            value = fields.get(name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value)
        embed = fields.get("embed")
        if isinstance(embed, torch.Tensor) and embed.numel():
            self.embeds.extend(torch.split(embed.reshape(-1, embed.shape[-1]), 1))

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
