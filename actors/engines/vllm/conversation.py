"""``History``: a conversation as the token list its vLLM request should hold.

The list is the conversation in the chat template's layout: system turns, user turns,
each reply after its opening and closed by the assistant turn's suffix. Appends are
prefilled as they come; everything else (a ``clear``, a truncation, a failed response)
is a cut back to a known length followed by appends, and :attr:`History.low_water`
records the lowest position a cut touched, so the engine knows whether the request it
holds open still matches (else it opens a new one; vLLM's prefix cache keeps that cheap).

An audio clip (one encoder window of what the user said, ``audio_input``) sits in the
list as vLLM expands it (``<|audio_start|>``, one placeholder per audio-encoder output,
``<|audio_end|>``); :attr:`History.clips` keeps its log-mel features by the position of
its first placeholder, so a request opened over the list sends the clip again (as one
placeholder and the features, the form vLLM expands).

The open turn's rows go to the talker as they become final, before its commit
(:meth:`History.unsent`): its text positions once prefilled, each clip's once its hidden
states are taken. :attr:`History.ahead` counts those the talker holds, so that the
commit sends only the rest and a ``clear`` takes them back. No cut ever sits under an
open turn (a truncation is refused while one is open; a clear or a failure drops it), so
the rows sent are never recomputed behind another prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

import torch

from omni_actors.actors.engines.rows_ahead import RowsAhead
from omni_actors.actors.engines.turn_marks import check_truncatable
from omni_actors.actors.engines.vllm.turns import TurnTemplate
from omni_actors.errors import EngineError

__all__ = ["Clip", "History", "Mark", "ReplyTokens", "VllmInputError"]

_NONE: Final = 1 << 62  # ``low_water`` when nothing was cut


class VllmInputError(EngineError, ValueError):
    """Input the vLLM thinker cannot take (audio, a malformed mark or instruction)."""


@dataclass(frozen=True, slots=True)
class ReplyTokens:
    """The last reply (assistant turn) in the token list: where it starts, and its tokens."""

    start: int
    tokens: tuple[int, ...] = ()


@dataclass(slots=True)
class Clip:
    """One audio clip of a user turn: one encoder window of what the user said.

    Attributes:
        features: [n_mels, frames] float32, its log-mel.
        count: its placeholders in the token list.
        uuid: its identity for vLLM's caches: a clip said again is another clip (its
            hidden states are needed again), a clip sent again after a reopen is not.
        states: [count, H] the thinker's hidden states at its placeholders, once its
            prefill ran.
    """

    features: torch.Tensor
    count: int
    uuid: str
    states: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """A state to come back to (a checkpoint)."""

    length: int
    reply: ReplyTokens | None
    turns_since_reply: int
    system: tuple[int, ...]


@dataclass
class History:
    """One conversation's token list and the turn bookkeeping around it."""

    tokens: list[int] = field(default_factory=list)
    turn_start: int | None = None
    """Where the open user turn starts (None: no turn is open)."""
    waiting: tuple[int, ...] = ()
    """A system turn set while a user turn was open: it follows that turn's commit."""
    reply: ReplyTokens | None = None
    replying: bool = False
    turns_since_reply: int = 0
    system: tuple[int, ...] = ()
    """System turns fed since the last reply (a truncation puts them back after it)."""
    clips: dict[int, Clip] = field(default_factory=dict)
    """Audio clips by the position of their first placeholder."""
    low_water: int = _NONE
    instructions: str = ""
    tools: str = "[]"
    """The caller's last instructions and tools: the system turn is rendered from both
    when either changes (not checkpointed: the caller's setting)."""
    ahead: RowsAhead = field(default_factory=RowsAhead)
    """Rows of the open turn the talker holds (sent ahead of its commit), and rows of a
    cleared one it must let go."""

    def checkpoint(self) -> Mark:
        """The state now, between turns (an open turn is not part of it)."""
        length = len(self.tokens) if self.turn_start is None else self.turn_start
        return Mark(length, self.reply, self.turns_since_reply, self.system)

    def restore(self, mark: Mark) -> None:
        """Come back to ``mark``: what came after it is forgotten (an open turn too)."""
        self._cut(mark.length)
        self.turn_start, self.waiting, self.replying = None, (), False
        # Rows sent ahead of a turn dropped by a failure go with the failed response.
        self.ahead = RowsAhead()
        self.reply, self.turns_since_reply, self.system = (
            mark.reply,
            mark.turns_since_reply,
            mark.system,
        )

    def clear(self, mark: Mark) -> bool:
        """Drop the open turn (back to ``mark``, the last commit). A system turn waiting
        behind it is appended now. Returns whether one was (the checkpoint moves).
        The rows of the turn sent ahead are to be taken back (:attr:`ahead`)."""
        waiting, ahead = self.waiting, self.ahead.dropped()
        self.restore(mark)
        self.ahead = ahead
        if waiting:
            self.tokens.extend(waiting)
            self.system = (*self.system, *waiting)
        return bool(waiting)

    def say(self, ids: list[int], turns: TurnTemplate) -> None:
        """Append user content, opening a user turn first if none is open."""
        if not ids:
            return
        if self.turn_start is None:
            self.turn_start = len(self.tokens)
            self.tokens.extend(turns.user.prefix)
        self.tokens.extend(ids)

    def hear(self, clip: Clip, turns: TurnTemplate, audio: tuple[int, int, int]) -> None:
        """Append an audio clip as user content: ``audio`` is (start, placeholder, end)."""
        start, placeholder, end = audio
        self.say([start], turns)
        self.clips[len(self.tokens)] = clip
        self.tokens.extend([placeholder] * clip.count)
        self.tokens.append(end)

    def sent_form(self, begin: int, placeholder: int) -> tuple[list[int], list[Clip]]:
        """``tokens[begin:]`` as vLLM takes them: each clip's placeholders as one, and
        the clips in order (none may start before ``begin`` and end after it)."""
        ids: list[int] = []
        clips: list[Clip] = []
        at = begin
        for start in sorted(s for s in self.clips if s >= begin):
            clip = self.clips[start]
            ids.extend(self.tokens[at:start])
            ids.append(placeholder)
            clips.append(clip)
            at = start + clip.count
        ids.extend(self.tokens[at:])
        return ids, clips

    def instruct(self, system: tuple[int, ...]) -> bool:
        """Set the instructions: appended now with no turn open (returns True), else
        held until the open turn is committed (a later call replaces them)."""
        if self.turn_start is not None:
            self.waiting = system
            return False
        self.tokens.extend(system)
        self.system = (*self.system, *system)
        return bool(system)

    def unsent(self, prefilled: int) -> range:
        """The open turn's positions whose rows are final and not sent yet: those among
        the first ``prefilled`` tokens (sent to vLLM and prefilled), up to the first
        clip whose hidden states were not taken. Empty with no turn open."""
        if self.turn_start is None:
            return range(0)
        begin = self.turn_start + self.ahead.sent
        end = min(prefilled, len(self.tokens))
        for start in sorted(s for s in self.clips if begin <= s < end):
            clip = self.clips[start]
            if clip.states is None or start + clip.count > end:
                end = start
                break
        return range(begin, max(begin, end))

    def commit(self, turns: TurnTemplate) -> tuple[range, RowsAhead] | None:
        """Close the open user turn: its positions the talker does not hold yet (its
        rows to send) and the count of those it holds, to send them with (:attr:`ahead`
        starts afresh); None if no turn is open."""
        if self.turn_start is None:
            return None
        self.tokens.extend(turns.user.suffix)
        rows = range(self.turn_start + self.ahead.sent, len(self.tokens))
        ahead, self.ahead = self.ahead, RowsAhead()
        self.tokens.extend(self.waiting)
        self.system = (*self.system, *self.waiting)
        self.turn_start, self.waiting = None, ()
        self.turns_since_reply += 1
        return rows, ahead

    def open_reply(self, turns: TurnTemplate) -> None:
        """Append the assistant opening; the reply's tokens follow."""
        self.tokens.extend(turns.opening)
        self.reply = ReplyTokens(len(self.tokens))
        self.replying = True
        self.turns_since_reply, self.system = 0, ()

    def take_reply(self, tokens: tuple[int, ...], turns: TurnTemplate) -> None:
        """Append an assistant turn generated earlier (a ``reply`` mark), as a decoded
        reply leaves the list: opening, ``tokens``, the assistant turn's suffix. It is
        then the last reply, which a truncation can cut. Commit the open turn first."""
        assert self.turn_start is None, "the engine commits the open turn first"
        self.open_reply(turns)
        self.reply = ReplyTokens(len(self.tokens), tokens)
        self.tokens.extend(tokens)
        self.end_reply(turns)

    def reply_token(self, token: int) -> None:
        """Append a token of the reply being generated."""
        assert self.reply is not None
        self.tokens.append(token)
        self.reply = replace(self.reply, tokens=(*self.reply.tokens, token))

    def end_reply(self, turns: TurnTemplate) -> None:
        """Close the reply with the assistant turn's suffix."""
        if self.replying:
            self.tokens.extend(turns.assistant.suffix)
            self.replying = False

    def truncate(self, kept: int, turns: TurnTemplate) -> None:
        """Cut the last reply to its first ``kept`` tokens.

        Raises:
            TurnMarkError: no reply, a user turn committed after it, or ``kept`` < 0.
        """
        reply = check_truncatable(
            None if self.replying else self.reply,
            committed_after=bool(self.turns_since_reply) or self.turn_start is not None,
            kept=kept,
        )
        kept = min(kept, len(reply.tokens))
        self._cut(reply.start + kept)
        self.tokens.extend(turns.assistant.suffix)
        self.tokens.extend(self.system)
        self.reply = replace(reply, tokens=reply.tokens[:kept])

    def _cut(self, length: int) -> None:
        if length < len(self.tokens):
            del self.tokens[length:]
            self.low_water = min(self.low_water, length)
            for start in [s for s in self.clips if s >= length]:
                del self.clips[start]

    def synced(self) -> None:
        """The engine's request matches the list again: forget past cuts."""
        self.low_water = _NONE
