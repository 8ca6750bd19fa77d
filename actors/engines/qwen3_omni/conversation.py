"""``Conversation``: one session's thinker state across responses, and its rollbacks.

The KV cache holds the conversation so far, turn after turn (the release's chat
template; the roles are the config's ``system``/``user``/``assistant`` ids, as HF's talker
finds the turns it conditions on by them; :class:`~.vocabulary.Vocabulary`)::

    [<|im_start|> system \\n instructions <|im_end|> \\n]
    <|im_start|> user \\n (text | <|audio_start|> PAD*n <|audio_end|>)* <|im_end|> \\n
    <|im_start|> assistant \\n  reply tokens  [<|im_end|> \\n]  <|im_start|> user \\n ...

A system turn (``Vocabulary.system_turn``) sets the conversation's instructions from where it
stands on; it may come between any two turns. It is the thinker's alone: HF's talker
conditions on user turns only (``generate`` skips system-role segments), so no row of
it is sent on.

A reply's end is not fed at once: its last token when it stopped at its token limit,
then ``<|im_end|> \\n``, wait in :attr:`Conversation.carry` and are fed before whatever
comes next, so nothing is computed that a truncation or a clear would throw away. A
system turn fed after the reply goes back into the carry when a truncation cuts the
reply before it (:attr:`Conversation.system`).

Every change of plan is a crop of the cache back to a known position plus the tokens
that then close the last reply: a ``clear`` back to the last commit, a failed response
back to where it started, a truncation back into the reply. :class:`Checkpoint` is that
position with the conversation's other state at the time. The cache is the session's
slot of the engine's :class:`~omni_actors.actors.engines.qwen3_omni.slot_cache.SlotCache`;
its length is the step loop's count for the session's request, so a crop moves that
count and copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from omni_actors.actors.engines.step_loop import Request, StepLoop
from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.actors.engines.turn_marks import check_truncatable

__all__ = ["Checkpoint", "Conversation", "ThinkerReply"]


@dataclass(frozen=True)
class ThinkerReply:
    """The thinker's last reply (assistant turn) in its cache: what a truncation cuts.

    Attributes:
        start: cache position of its first token (after ``<|im_start|> assistant \\n``).
        tokens: the tokens the engine yielded, in order.
        fed: how many of ``tokens`` are in the cache (the rest are in the carry).
    """

    start: int
    tokens: tuple[int, ...]
    fed: int


@dataclass(frozen=True)
class Checkpoint:
    """What a rollback restores: a cache length and the state that goes with it."""

    position: int
    carry: tuple[int, ...]
    reply: ThinkerReply | None
    turns_since_reply: int
    system: tuple[int, ...]
    rng: torch.Tensor | None


@dataclass
class Conversation:
    """One session's thinker state, kept across responses until release or abort."""

    request: Request[Any, Any]
    """The session's request in the engine's step loop (its slot and length)."""
    loop: StepLoop[Any, Any]
    carry: list[int] = field(default_factory=list)
    """Tokens that close the last reply, fed before whatever comes next."""
    reply: ThinkerReply | None = None
    turns_since_reply: int = 0
    """User turns committed since :attr:`reply` (a truncation must come before them)."""
    system: tuple[int, ...] = ()
    """System turns fed after :attr:`reply` (before any user turn: truncation is only
    allowed then), in order: a truncation crops them with the reply's end, and puts them
    back into the carry."""
    generator: torch.Generator | None = None
    """The session's sampling generator, made on its first sampled response."""
    decoded: tuple[int, ...] | None = None
    """The reply the session's last response decoded (as far as it was yielded); None
    when it decoded none or failed. The session stores it to replay the conversation;
    a reply taken back from a ``reply`` mark is not one."""
    signal: AbortSignal | None = None
    """Set while a response is being generated."""
    instructions: str = ""
    tools: str = "[]"
    """The caller's last instructions and tools (each kept until set again): the system
    turn is rendered from both when either changes. Not checkpointed: they are the
    caller's setting, not the conversation's."""

    @property
    def position(self) -> int:
        """Tokens in the cache: the next forward starts here."""
        return self.request.computed

    def checkpoint(self) -> Checkpoint:
        """The state to come back to (the cache is cropped, never copied)."""
        rng = None if self.generator is None else self.generator.get_state()
        return Checkpoint(
            self.position,
            tuple(self.carry),
            self.reply,
            self.turns_since_reply,
            self.system,
            rng,
        )

    def restore(self, checkpoint: Checkpoint) -> None:
        """Come back to ``checkpoint``: everything computed after it is forgotten."""
        self.crop(checkpoint.position)
        self.carry = list(checkpoint.carry)
        self.reply = checkpoint.reply
        self.turns_since_reply = checkpoint.turns_since_reply
        self.system = checkpoint.system
        if checkpoint.rng is not None and self.generator is not None:
            self.generator.set_state(checkpoint.rng)

    def queue_system(self, system: tuple[int, ...]) -> None:
        """Feed the system turn ``system`` before whatever comes next, behind the carry.

        For instructions a rollback took out of the cache with a failed response: they
        are the caller's setting, which holds whatever became of the response.
        """
        self.carry.extend(system)
        self.system = (*self.system, *system)

    def crop(self, position: int) -> None:
        """Forget every cached position from ``position`` on (between forwards)."""
        if position > self.position:
            raise ValueError(f"cannot crop {self.position} cached tokens to {position}")
        self.loop.rewind(self.request, position)

    def truncate(self, kept: int, close_turn: tuple[int, ...]) -> None:
        """Cut the last reply to its first ``kept`` tokens (between user turns only), to
        be closed by ``close_turn`` (``<|im_end|> \\n``).

        Raises:
            TurnMarkError: there is no reply, a user turn was committed after it, or
                ``kept`` is negative.
        """
        reply = check_truncatable(self.reply, committed_after=self.turns_since_reply > 0, kept=kept)
        kept = min(kept, len(reply.tokens))
        fed = min(kept, reply.fed)
        self.crop(reply.start + fed)
        self.carry = [*reply.tokens[fed:kept], *close_turn, *self.system]
        self.reply = replace(reply, tokens=reply.tokens[:kept], fed=fed)
