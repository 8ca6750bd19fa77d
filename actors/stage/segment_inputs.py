"""``SegmentInputs``: what an engine reads of one segment (one response) of a session.

The iterator a stage hands to ``Engine.generate``: the session's queued chunks as
payload fields, until every source has ended the segment, each wait bounded by the
session's deadlines. It turns the caller's turn marks into ``TURN_FIELD`` inputs for an
engine that declares them, and carries the response's options once they arrive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import torch

from omni_actors.actors.engines.contract import (
    CONTEXT_FIELD,
    KEPT_FIELD,
    NO_OPTIONS,
    REPLY_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
)
from omni_actors.clock import Timeout
from omni_actors.protocols.stage import End

if TYPE_CHECKING:
    from omni_actors.actors.stage.session import StageSession

__all__ = ["SegmentInputs"]


class SegmentInputs(AsyncIterator[Fields]):
    """The engine's view of one segment's input: chunks until every source ends it.

    ``options`` are the response's overrides, once the chunk that carries them arrived
    (``omni_actors.actors.engines.contract.response_options``). Until then, in a resumable
    session, the user is still speaking: every wait for input is bounded by
    ``idle_s``; once the response started, by ``inter_chunk_s``.

    ``first_output`` is the deadline of the engine's first output while the stage waits
    for it: suspended while the engine waits for input, due ``first_chunk_s`` after the
    last input it took.
    """

    def __init__(self, session: StageSession, start: float) -> None:
        self.session = session
        self.start = start
        self.ended: set[str] = set()
        self.end: End = ""
        self.started = False
        self.options: ResponseOptions = NO_OPTIONS
        self.responding = False
        self.last = start
        self._first: Fields | None = None
        self.first_output: Timeout | None = None

    def __aiter__(self) -> SegmentInputs:
        return self

    async def has_payload(self) -> bool:
        """Wait for the segment's first input; False if it ended without any.

        A segment that carries nothing (a resumable session closed without new input)
        never reaches the engine, so no reply is made up for it; but a response asked
        for with nothing new said (its chunk carries options) does: it answers the
        conversation so far.
        """
        try:
            self._first = await self.__anext__()
        except StopAsyncIteration:
            return self.responding
        return True

    async def drain(self) -> AsyncIterator[Fields]:
        """What is left of the segment's input, through its end (the engine's done)."""
        self._first = None
        async for fields in self:
            yield fields

    async def __anext__(self) -> Fields:
        deadline = self.first_output
        if deadline is not None:
            deadline.reschedule(None)  # no output is due while the engine waits for input
        try:
            if self._first is not None:
                first, self._first = self._first, None
                return first
            s = self.session
            while len(self.ended) < len(s.sources):
                d = s.deadlines
                if not self.started:
                    limit, setting = (
                        (d.idle_s, "idle_s") if s.resumable else (d.first_chunk_s, "first_chunk_s")
                    )
                    what = "first input chunk of the segment"
                elif s.resumable and not self.responding:
                    limit, setting, what = d.idle_s, "idle_s", "next input chunk of the turn"
                else:
                    limit, setting, what = d.inter_chunk_s, "inter_chunk_s", "next input chunk"
                base = self.last if self.started else self.start
                chunk = await s.next_chunk(base + limit, what, limit, setting)
                self.started = True
                self.last = s.clock.now()
                if chunk.options is not None:
                    self.options = chunk.options
                    self.responding = True
                    for outlet in s.outlets:
                        outlet.stamp(chunk.options)
                if chunk.end:
                    self.ended.add(chunk.source)
                    if chunk.end == "finished" or self.end != "finished":
                        self.end = chunk.end
                if chunk.mark:
                    if s.takes_marks:
                        marked: dict[str, Any] = {TURN_FIELD: chunk.mark}
                        if chunk.mark == "truncate":
                            marked[KEPT_FIELD] = torch.tensor(chunk.kept)
                        elif chunk.mark == "reply" and REPLY_FIELD in chunk.tensors:
                            marked[REPLY_FIELD] = chunk.tensors[REPLY_FIELD]
                        return marked
                    continue
                if chunk.has_payload:
                    fields: dict[str, Any] = chunk.fields()
                    if s.transfers is not None:
                        fields = s.transfers.load(fields)
                    if chunk.context:
                        fields[CONTEXT_FIELD] = torch.tensor(chunk.context)
                    return fields
            raise StopAsyncIteration
        finally:
            if deadline is not None:
                s = self.session
                deadline.reschedule(s.clock.now() + s.deadlines.first_chunk_s)
