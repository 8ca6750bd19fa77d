"""``ConversationLog``: what a conversation replays onto its stages after one restarted.

A stage that dies loses every session's state on it; the stages around it still hold
theirs, but their streams to and from the dead instance are broken. A conversation is
worth more than its turn in flight, so a session remembers the conversation as it
stands — every chunk its caller sent to the entry stage (input and turn marks, as sent,
assistant turns the caller added among them) and, per response, the reply generated
by the stage that writes the replies (its token ids, as that stage reported them:
``StageReport.reply``; ``PipelineSpec.reply_stage``: the entry, or the text output stage
after an entry that passes the conversation on, as a cascade's LLM after its
recognizer) — and after a restart opens again on every stage under a new key and sends
it all through the entry stage before the caller's next input. The stages rebuild their
state from it as they built it the first time; the replies are stored, not generated
again, so the conversation is what the user heard.

What a response's end did to the conversation decides what is kept of it:

- completed or cancelled: its input stays, closed by a ``commit``, then its reply (if
  one was generated) as a ``reply`` mark;
- failed by the engine that writes the replies, or by the entry (its state went back to
  where the response started): only what outlives such a rollback stays — truncations,
  and instructions;
- failed because a stage on the path died: its input stays, committed (the caller may
  ``respond`` again), without a reply.

The caller may take a turn out of the conversation (``Session.delete``): a user turn,
named by the id it gave the ``commit`` that closed it (its input goes, instructions
sent amid it stay), an assistant turn it gave (a ``reply`` mark named by its id), or a
response's reply (with the truncations that cut it). The
stages then replay the conversation as it now stands, as after a restart.

Bounded by ``inputs.max_history_bytes``: past it the log lets go of everything and says
why (:attr:`ConversationLog.lost`), and the session can no longer be replayed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD, REPLY_FIELD
from omni_actors.protocols.stage import End, Mark

__all__ = ["ConversationLog", "LoggedChunk"]


@dataclass(frozen=True, slots=True)
class LoggedChunk:
    """One chunk to send again: its payload and turn mark (see ``SessionInput.send``);
    ``turn``: with a ``commit``, the id the caller gave the turn it closes."""

    payload: Mapping[str, torch.Tensor | str]
    mark: Mark = ""
    kept: int = 0
    turn: str = ""


@dataclass(slots=True)
class _Segment:
    chunks: list[LoggedChunk] = field(default_factory=list)
    ended: bool = False  # the caller ended it: its input is a committed user turn
    reply: tuple[int, ...] | None = None


_COMMIT = LoggedChunk({}, "commit")


class ConversationLog:
    """A conversation as it stands, to replay (see the module docstring).

    Args:
        max_bytes: the most it holds (``inputs.max_history_bytes``).
        records: False for an entry engine that keeps no conversation (it takes no turn
            marks): each response stands alone, and reopening the stages is all a
            restart needs, with nothing to replay.
    """

    def __init__(self, max_bytes: int, *, records: bool = True) -> None:
        self.records = records
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.lost = "" if max_bytes > 0 else "inputs.max_history_bytes is 0"
        self._segments: dict[int, _Segment] = {}

    def sent(
        self,
        segment: int,
        payload: Mapping[str, torch.Tensor | str],
        *,
        mark: Mark = "",
        kept: int = 0,
        end: End = "",
        turn: str = "",
    ) -> None:
        """The caller sent this chunk in ``segment`` (an ``end`` ends the segment;
        ``turn`` names the user turn a ``commit`` closes, or the assistant turn a
        ``reply`` mark gives)."""
        if self.lost:
            return
        if end == "finished":  # nothing follows to replay it for
            self._drop("the session was finishing")
            return
        if not self.records:
            return
        entry = self._segments.setdefault(segment, _Segment())
        if payload or mark:
            entry.chunks.append(LoggedChunk(dict(payload), mark, kept, turn))
            self._grow(_size(payload))
        entry.ended |= bool(end)

    def answered(
        self,
        segment: int,
        *,
        reply: tuple[int, ...] | None,
        rolled_back: bool = False,
    ) -> None:
        """``segment``'s response is done: the stage that writes the replies generated
        ``reply`` (None: no reply kept), or a stage failed it and went back to where it
        started (``rolled_back``)."""
        if self.lost or not self.records:
            return
        entry = self._segments.setdefault(segment, _Segment(ended=True))
        if rolled_back:
            kept = _survivors(entry.chunks)
            self._grow(-sum(_size(c.payload) for c in entry.chunks) + _size_all(kept))
            entry.chunks, entry.ended = kept, False
        elif reply is not None:
            entry.reply = reply
            self._grow(8 * len(reply))

    def delete_turn(self, turn: str) -> bool:
        """Take out the user turn whose ``commit`` was named ``turn``: its input since
        the mark before it (instructions sent amid it stay); or the assistant turn a
        ``reply`` mark so named gave (the mark alone). False if no such turn is kept
        (never sent under that name, or gone with a failed response)."""
        for entry in self._segments.values():
            for end, chunk in enumerate(entry.chunks):
                if chunk.mark == "reply" and turn and chunk.turn == turn:
                    del entry.chunks[end]
                    self._grow(-_size(chunk.payload))
                    return True
                if chunk.mark != "commit" or chunk.turn != turn:
                    continue
                start = end
                while start > 0 and not entry.chunks[start - 1].mark:
                    start -= 1
                span = entry.chunks[start : end + 1]
                stays = [c for c in span if INSTRUCTIONS_FIELD in c.payload]
                entry.chunks[start : end + 1] = stays
                self._grow(_size_all(stays) - _size_all(span))
                return True
        return False

    def delete_reply(self, segment: int) -> bool:
        """Take out the reply of ``segment``'s response, and the truncations of it (every
        ``truncate`` mark up to the next reply: each cut the last reply, this one).
        False if none is kept (the response produced none, or failed)."""
        entry = self._segments.get(segment)
        if entry is None or entry.reply is None:
            return False
        self._grow(-8 * len(entry.reply))
        entry.reply = None
        for number in sorted(s for s in self._segments if s > segment):
            later = self._segments[number]
            later.chunks = [c for c in later.chunks if c.mark != "truncate"]
            if later.reply is not None:
                break
        return True

    def replay(self) -> Iterator[LoggedChunk]:
        """The chunks that rebuild the conversation, in order."""
        for number in sorted(self._segments):
            entry = self._segments[number]
            yield from entry.chunks
            if entry.ended:
                yield _COMMIT
            if entry.reply is not None:
                ids = torch.tensor(entry.reply, dtype=torch.int64)
                yield LoggedChunk({REPLY_FIELD: ids}, "reply")

    def _grow(self, nbytes: int) -> None:
        self.nbytes += nbytes
        if self.nbytes > self.max_bytes:
            self._drop(
                f"the conversation passed inputs.max_history_bytes ({self.max_bytes} bytes) "
                "and is no longer kept to replay"
            )

    def _drop(self, why: str) -> None:
        self.lost = why
        self._segments.clear()
        self.nbytes = 0


def _survivors(chunks: list[LoggedChunk]) -> list[LoggedChunk]:
    """What of a response's input outlives the entry engine's rollback of it: its
    truncations, and the last instructions it set (fed again before what comes next)."""
    kept = [c for c in chunks if c.mark == "truncate"]
    said = [c.payload[INSTRUCTIONS_FIELD] for c in chunks if INSTRUCTIONS_FIELD in c.payload]
    if said:
        kept.append(LoggedChunk({INSTRUCTIONS_FIELD: said[-1]}))
    return kept


def _size(payload: Mapping[str, torch.Tensor | str]) -> int:
    return sum(
        value.nbytes if isinstance(value, torch.Tensor) else len(value.encode())
        for value in payload.values()
    )


def _size_all(chunks: list[LoggedChunk]) -> int:
    return sum(_size(c.payload) for c in chunks)
