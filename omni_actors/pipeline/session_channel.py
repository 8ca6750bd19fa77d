"""``SessionChannel``: where a session's events wait for its caller, and the one owner of
the session's state that both sides of it read.

Shared, in the caller's process, by the caller's side (``Session``, ``SessionInput``,
``Response``: they read events, spend credits of the input's window, start responses
and end segments) and the session's actor (``SessionActor``, ``ClientStreams``: they put
events, grant the output stages' credits as the caller reads them, complete segments,
cut and reopen the session's streams when a stage restarts). Each side changes that
state only through the channel's methods, each named for the step of the session's
life it is: no other module assigns a channel's attributes (a test reads the source to
hold that), so what changes the state can be read in this one file.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import msgspec

from omni_actors.actors.stage.flow import CreditWindow, Inflow
from omni_actors.pipeline.conversation_log import ConversationLog
from omni_actors.protocols.control import DEFAULT_WINDOW
from omni_actors.protocols.events import AudioDelta, Event, TextDelta

__all__ = ["SessionChannel"]


class SessionChannel:
    """Where a session's events go, and when each segment started (``time.monotonic``,
    finer than the loop's clock, which may tick in milliseconds).

    Shared between the caller's handle and the session actor, in one process. A deque
    and one waiter rather than an ``asyncio.Queue``: every text and audio delta passes
    here, and there is exactly one reader.

    It is also where the caller's side of flow control meets the session actor:
    ``input`` is the credit window of the caller's input (``Session.send`` spends it,
    the entry stage's credits refill it), ``transcriber_input`` that of the input the
    caller's side fans out to the transcriber (its credits refill it), and ``inflow`` —
    set by the session actor — counts the output stages' chunks, granted back as the
    caller reads their events. ``transcriber_lost`` says why the transcriber no longer
    has the session ("" while it has): its input is then no longer sent.

    Args:
        sample_rate: of the session's audio.
        window: chunks in flight per stream (the pipeline's ``flow.window``).
    """

    __slots__ = (
        "_completion",
        "_early",
        "_events",
        "_waiter",
        "asked",
        "completed",
        "history",
        "inflow",
        "input",
        "responses",
        "sample_rate",
        "segments_sent",
        "stale",
        "starts",
        "terminal",
        "transcriber_input",
        "transcriber_lost",
        "window",
    )

    def __init__(
        self,
        sample_rate: int,
        window: int = DEFAULT_WINDOW,
        history: ConversationLog | None = None,
    ) -> None:
        self.sample_rate = sample_rate
        self.window = window
        self.starts: dict[int, float] = {}
        self.responses: dict[int, str] = {}  # response id by segment, set by the caller
        self.asked = 0  # segments whose reply the caller has asked for (see ``put_delta``)
        self.completed = 0  # segments whose ResponseDone (or the terminal event) is out
        self.segments_sent = 0  # segments the caller has ended (its input's segment)
        # The conversation to replay after a stage restart (None: it is not replayed),
        # and why the stages must be reopened before the next input ("": they need not).
        self.history = history
        self.stale = ""
        self.terminal: Event | None = None
        self.input = CreditWindow(window)
        self.transcriber_input = CreditWindow(window)
        self.transcriber_lost = ""
        self.inflow: Inflow | None = None
        # Each event with the output stage whose chunk it ends ("" for the others): its
        # read is that chunk taken.
        self._events: deque[tuple[Event, str]] = deque()
        # A conversation's deltas of the reply the caller has not asked for yet, with
        # their sources and segments (see ``put_delta``).
        self._early: list[tuple[TextDelta | AudioDelta, str, int]] = []
        self._waiter: asyncio.Future[None] | None = None
        self._completion: asyncio.Future[None] | None = None  # see ``wait_completed``

    def put(self, event: Event, source: str = "") -> None:
        """Queue an event; after a terminal one, nothing more is queued.

        ``source``: the output stage whose chunk this event ends, granted a credit once
        the caller has read it.
        """
        if self.terminal is None:
            self._push(event, source)

    def put_delta(self, event: TextDelta | AudioDelta, source: str, segment: int) -> None:
        """Queue a delta of a conversation's reply to ``segment``, named for its response.

        In a conversation a segment's reply starts when the caller asks for it
        (``respond``, or the segment's end), but an entry engine may answer the turn
        while it still arrives (one that yields as its input streams in). Such deltas are
        the reply's all the same: they are held here, unread (their chunks count against
        the output stage's window), until the caller asks for that reply, then queued
        under its response's id (:meth:`response_started`).
        """
        if self.terminal is not None:
            return
        if segment >= self.asked:
            self._early.append((event, source, segment))
            return
        self._push(self._named(event, segment), source)

    def _named(self, event: TextDelta | AudioDelta, segment: int) -> TextDelta | AudioDelta:
        """``event`` under the id of ``segment``'s response, which it may predate."""
        response = self.responses.get(segment, "")
        if event.response == response:
            return event
        return msgspec.structs.replace(event, response=response)

    def _ask(self, segment: int) -> None:
        """The caller asked for ``segment``'s reply: the deltas held for it go out."""
        if segment < self.asked:
            return
        self.asked = segment + 1
        # Held deltas are the session actor's current segment's, never past the caller's.
        early, self._early = self._early, []
        for event, source, of in early:
            self._push(self._named(event, of), source)

    def end(self, event: Event) -> bool:
        """Queue the terminal event; False if the session had already ended.

        No more input is taken: a ``send`` waiting for a credit returns at once.
        """
        if self.terminal is not None:
            return False
        self._push(event, "")
        self.terminal = event
        self._early.clear()  # a reply never asked for: nobody reads it
        self.input.close()
        self.transcriber_input.close()
        self._wake_completion()
        return True

    # -- the caller's side ------------------------------------------------------------

    def segment_started(self, segment: int) -> None:
        """``segment``'s latency counts from now (``time.monotonic``)."""
        self.starts[segment] = time.monotonic()

    def response_started(self, segment: int, response: str = "") -> None:
        """Response ``response`` answers ``segment`` ("": the reply a session's last
        segment gets, which has no id); its latency counts from now, and the deltas held
        for it (``put_delta``) go out now."""
        if response:
            self.responses[segment] = response
        self.starts[segment] = time.monotonic()
        self._ask(segment)

    def segment_sent(self, segments: int) -> None:
        """The caller has ended its input's first ``segments`` segments (their replies
        are asked for)."""
        self.segments_sent = segments
        if segments:
            self._ask(segments - 1)

    # -- the session actor's side -------------------------------------------------------

    def attach(self, inflow: Inflow) -> None:
        """The output stages' streams of the session's current key count here; reading
        their events grants their credits."""
        self.inflow = inflow

    def cut(self, why: str) -> None:
        """A stage on the session's path died: the session must be opened again (and its
        conversation replayed) before the next input. A send waiting for the dead
        stage's credit wakes to reopen it; events queued from the cut streams grant
        nothing when read."""
        self.stale = why
        self.input.close()
        self.transcriber_input.close()
        self._early.clear()  # the open segment's: its streams are gone, and replayed
        self.forget_sources()

    def lose_transcriber(self, why: str) -> None:
        """The transcriber dropped the session (it failed or died): no more input goes
        to it (the reply's stages keep theirs) until the session opens again."""
        self.transcriber_lost = why
        self.transcriber_input.close()

    def reopening(self) -> None:
        """The session opens again under a new key: its input gets a fresh window."""
        self.input = CreditWindow(self.window)
        self.transcriber_input = CreditWindow(self.window)

    def reopened(self) -> None:
        """Every stage has the session again: input may flow."""
        self.stale = ""
        self.transcriber_lost = ""

    def complete(self, segments: int) -> None:
        """The first ``segments`` segments have their ``ResponseDone`` queued."""
        self.completed = segments
        self._wake_completion()

    async def wait_completed(self, segment: int) -> None:
        """Until ``segment``'s ``ResponseDone`` (or the terminal event) is queued.

        The caller's deadline bounds it (``asyncio.timeout``).
        """
        while self.completed <= segment and self.terminal is None:
            if self._completion is None:
                self._completion = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._completion)

    def _wake_completion(self) -> None:
        completion, self._completion = self._completion, None
        if completion is not None and not completion.done():
            completion.set_result(None)

    async def drop_deltas(self, response: str) -> int:
        """Drop the queued text and audio deltas of ``response``; how many were dropped.

        A dropped event is read as far as flow control goes: its chunk counts as taken,
        and the credits that makes due go back to its output stage.
        """
        kept: deque[tuple[Event, str]] = deque()
        dropped: list[str] = []
        for event, source in self._events:
            if isinstance(event, TextDelta | AudioDelta) and event.response == response:
                dropped.append(source)
            else:
                kept.append((event, source))
        if not dropped:
            return 0
        self._events = kept
        inflow = self.inflow
        if inflow is not None and self.terminal is None:
            for source in dropped:
                if source and (due := inflow.taken(source)):
                    await inflow.grant(source, due)
        return len(dropped)

    def forget_sources(self) -> None:
        """The output stages' streams were cut (a stage died): reading the events queued
        from them grants nothing (the streams that follow count afresh)."""
        self._events = deque((event, "") for event, _ in self._events)

    @property
    def queued(self) -> int:
        """Events waiting for the caller."""
        return len(self._events)

    def _push(self, event: Event, source: str) -> None:
        self._events.append((event, source))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Event:
        """The next event, waiting for one if none is queued."""
        while not self._events:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        event, source = self._events.popleft()
        inflow = self.inflow
        if source and inflow is not None and self.terminal is None:
            due = inflow.taken(source)
            if due:
                try:
                    await inflow.grant(source, due)
                except BaseException:
                    # Cancelled before the credit went out: the event stays unread.
                    inflow.untake(source, due)
                    self._events.appendleft((event, source))
                    raise
        return event
