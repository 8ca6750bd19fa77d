"""``UserTurn``: the thinker's input since the last commit, prefilled as it arrives.

A user turn opens with the first text or audio after a commit (``<|im_start|> user
\\n``, behind the carry that closes the last reply) and is closed by the next commit
(``<|im_end|> \\n``). Text is prefilled chunk by chunk; a run of consecutive audio
chunks is one clip (``<|audio_start|> PAD*n <|audio_end|>``) whose encoder windows are
prefilled as each completes (:class:`~.audio_stream.AudioClip`), so that when the input
ends only the last window and the last text remain.

The turn keeps the talker rows of what it prefilled until they are sent (the engine
sends them as they are prefilled, before the commit: the talker prefills the turn while
it is spoken) and counts the rows the talker holds, so that a ``clear`` can take them
back; it keeps what it fed the thinker, to feed it again behind a shorter carry when a
truncation cuts the reply before it (the rows of audio placeholders then change: those
sent are taken back and the new ones sent in their place, :meth:`UserTurn.take_rows`).

Instructions that arrive while the turn is open wait in :attr:`UserTurn.system` and are
prefilled right behind its end, in the same forward (a system turn never splits a user
turn, and the user turn's rows never include it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from omni_actors.actors.engines.qwen3_omni.audio_stream import AudioClip
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.actors.engines.rows_ahead import RowsAhead

__all__ = ["Cat", "Feed", "UserTurn"]

Cat = Callable[[list[torch.Tensor]], torch.Tensor]
"""Joins tensors along dim 0 (``torch.cat``, or a GPU engine's own, which marks the result
as ready: :meth:`~.thinker_model.ThinkerModel.cat_rows`)."""


@dataclass(frozen=True)
class Feed:
    """One thinker forward's input: ids, and the audio embeddings of their AUDIO_PADs.

    Attributes:
        ids: the positions' ids, in order.
        audio: [n, H] encoder output for the ``n`` AUDIO_PAD ids, or None.
        skip: leading ids that close the last reply (the carry): not the user's turn.
        tail: trailing ids that open the reply: not the user's turn either.
    """

    ids: list[int]
    audio: torch.Tensor | None = None
    skip: int = 0
    tail: int = 0


@dataclass
class UserTurn:
    """The user turn being received (see the module docstring)."""

    vocabulary: Vocabulary
    """Where the turn's ids come from."""
    opened: bool = False
    pending: list[int] = field(default_factory=list)
    """Ids not prefilled yet."""
    skip: int = 0
    """Leading ``pending`` ids that are the carry."""
    clip: AudioClip | None = None
    """The audio run being received."""
    clip_open: bool = False
    """``<|audio_start|>`` of ``clip`` is prefilled (a window of it was)."""
    rows: list[torch.Tensor] = field(default_factory=list)
    """[n, H] talker rows of what was prefilled (see ``ThinkerEngine``)."""
    masks: list[torch.Tensor] = field(default_factory=list)
    """[n] bool, True at AUDIO_PAD rows."""
    fed: list[Feed] = field(default_factory=list)
    """What was prefilled of the turn (without the carry), to replay it."""
    ahead: RowsAhead = field(default_factory=RowsAhead)
    """The rows of the turn the talker holds (taken by :meth:`take_rows`)."""
    system: tuple[int, ...] = ()
    """The system turn of instructions set while the turn is open: prefilled behind it."""

    def open(self, carry: list[int]) -> None:
        """Start the turn behind ``carry`` unless it is open already."""
        if not self.opened:
            self.opened = True
            self.pending = [*carry, *self.vocabulary.user_opening]
            self.skip = len(carry)

    def next_feed(
        self, embeds: torch.Tensor | None, end_clip: bool, then: list[int], tail: int = 0
    ) -> Feed:
        """The forward input for the pending ids, ``embeds`` of the clip, then ``then``.

        ``embeds`` are the clip's new encoder outputs; ``end_clip`` closes the clip
        (``<|audio_end|>``, if any of it was heard); the last ``tail`` ids of ``then``
        are not the user's. Pending state moves into the feed.
        """
        ids, special = self.pending, self.vocabulary.ids
        if embeds is not None and embeds.shape[0]:
            if not self.clip_open:
                ids.append(special.audio_start)
                self.clip_open = True
            ids.extend([special.audio_pad] * embeds.shape[0])
        else:
            embeds = None
        if end_clip:
            if self.clip_open:
                ids.append(special.audio_end)
            self.clip, self.clip_open = None, False
        ids.extend(then)
        feed = Feed(ids, embeds, self.skip, tail)
        self.pending, self.skip = [], 0
        return feed

    def keep(self, feed: Feed, rows: torch.Tensor, placeholders: torch.Tensor) -> None:
        """Record a prefilled feed and its rows (the carry's and the reply's opening's rows
        are not the user's)."""
        end = len(feed.ids) - feed.tail
        self.rows.append(rows[feed.skip : end])
        self.masks.append(placeholders[feed.skip : end])
        self.fed.append(Feed(feed.ids[feed.skip : end], feed.audio))

    def replay(self, carry: list[int]) -> Feed | None:
        """What to feed again behind ``carry`` after a truncation cropped the cache back
        into the reply: the prefilled part of the turn, as one feed (None if nothing of
        it was prefilled; the carry then waits in front of the pending ids)."""
        if not self.fed:
            if self.opened:
                self.pending = [*carry, *self.pending[self.skip :]]
                self.skip = len(carry)
            return None
        ids = [*carry, *(i for feed in self.fed for i in feed.ids)]
        audio = [feed.audio for feed in self.fed if feed.audio is not None]
        self.rows, self.masks, self.fed = [], [], []
        # Fed behind another context, the rows of audio placeholders change: the talker's
        # go, the replay's are sent instead.
        self.ahead.take_back()
        return Feed(ids, torch.cat(audio) if audio else None, len(carry))

    def take_rows(self, cat: Cat = torch.cat) -> dict[str, torch.Tensor | str] | None:
        """The rows not taken yet, as an output; None if there is nothing to send.

        ``user`` [n, H] and ``user_mask`` [n] with ``user_edits``
        (:meth:`~omni_actors.actors.engines.rows_ahead.RowsAhead.output`). ``cat`` joins
        the pieces of each, when there are several.
        """
        if not self.rows:
            return self.ahead.output(None, None)
        user, mask = _joined(self.rows, cat), _joined(self.masks, cat)
        self.rows, self.masks = [], []
        return self.ahead.output(user, mask)


def _joined(parts: list[torch.Tensor], cat: Cat) -> torch.Tensor:
    # One piece goes as it is: a view of the step's output keeps that step's mark
    # (omni_actors.cuda.step_ready), where a copy made here would carry none.
    return parts[0] if len(parts) == 1 else cat(parts)
