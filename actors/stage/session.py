"""``StageSession``: one session's life on one stage.

A stage hosts many sessions at once; each has one of these. It owns the session's input
queue (fed by the stage's ``receive``), calls the engine once per segment with an input
iterator over that queue, routes every output through the session's outlets, and
reports each segment's end to the session's owner. What the engine reads of one segment
is a :class:`SegmentInputs`, the session's queue seen as the engine's input iterator.

In a conversation each segment is a response. A cancelled response stops at the engine's
next output (the stage closes ``generate``; the input still drains to the segment's end,
so the engine keeps consistent state and later stages end the segment too). An engine
that takes turn marks reads a user turn as its input, and yields outputs while it reads
(the turn's rows, sent ahead to the talker): it is stopped at its first output once its
input has ended, so a cancel never cuts a user turn short. An engine that raises fails
its response only: the stage reports ``failed``, drains the segment's input, ends the
segment on every outlet and serves the next one; so does an output the engine may not
yield (``engine_outputs``) and a first output that does not come within
``first_chunk_s`` of the engine's last input. Failures that break the session itself (a
broken input stream, an input deadline, a failure in the session's last segment) end it
here with an ``error`` report. Either report says where the failure came from
(``StageReport.failure``: the engine, a peer gone, lost chunks, a deadline), which only
the stage can tell. Every wait for input has a deadline on the stage's system clock
(virtual under ``ActorTestKit(virtual_time=True)``; in a worker process, that process's
real clock). The task that drives it all belongs to the stage's task scope: an abort
cancels it, and the task itself frees the session on the engine, once, however it ends.

Each stream in and out has a credit window (``omni_actors.actors.stage.flow``): the queue
holds at most a window of chunks per source, granted back as the engine takes them, and
each outlet waits for its receiver's credits, so a slow receiver slows this session's
engine and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from typing import Any

import torch

from omni_actors._task_scope import TaskScope
from omni_actors.actors.engines.contract import (
    CONTEXT_FIELD,
    KEPT_FIELD,
    NO_OPTIONS,
    REPLY_FIELD,
    TOOL_CALLS_FIELD,
    TURN_FIELD,
    Engine,
    Fields,
    ResponseOptions,
    engine_max_new_tokens,
    engine_prompt_tokens,
)
from omni_actors.actors.stage.accumulate import ChunkGapError, ChunkSequence
from omni_actors.actors.stage.device_links import DeviceLinks
from omni_actors.actors.stage.engine_outputs import (
    EngineOutputError,
    output_error,
    values_fit,
)
from omni_actors.actors.stage.flow import BackpressureError, CreditWindow, Inflow
from omni_actors.actors.stage.outlet import Outlet
from omni_actors.actors.stage.segment_metrics import SegmentMetrics
from omni_actors.actors.stage.spoken import SpokenOutputs
from omni_actors.actors.stage.steps import StepRouter
from omni_actors.clock import Clock, Timeout, timeout_at
from omni_actors.cuda import StageTransfers, on_device
from omni_actors.errors import (
    ActorStoppedError,
    OmniError,
    ProtocolError,
    WorkerDiedError,
    error_code,
    qualified_name,
)
from omni_actors.protocols.control import Prewarm
from omni_actors.protocols.stage import (
    Chunk,
    End,
    FailureCause,
    ReportEnd,
    SessionKey,
    StageReport,
)

__all__ = ["DeadlineExceededError", "SegmentInputs", "StageSession"]

log = logging.getLogger(__name__)


class DeadlineExceededError(OmniError, TimeoutError):
    """A stage waited longer than a session deadline allows."""

    code = "timeout"

    def __init__(self, stage: str, key: SessionKey, waiting_for: str, limit: float, setting: str):
        super().__init__(
            f"stage {stage}, session {key}: no {waiting_for} within {limit:g}s; "
            f"raise deadlines.{setting} in the pipeline if that wait is expected"
        )
        self.stage = stage
        self.setting = setting
        self.limit = limit


class StageSession:
    """State and task of session ``prewarm.key`` on stage ``stage``; see the module docstring.

    Args:
        stage: the stage's name.
        engine: the stage's engine (shared by all its sessions).
        prewarm: the session's route, owner and deadlines.
        on_end: called with this session once the task has ended, however it ended
            (cancelled before it ever ran included).
        clock: the stage's system clock; every deadline reads it.
        tasks: the stage's task scope, which owns the session's task.
        takes_marks: the engine declares :data:`TURN_FIELD` among its inputs (it gets
            the caller's turn marks; otherwise they are dropped here).
        outputs: the fields the engine declares it yields; an output with another
            field fails its reply (``engine_outputs``).
        spoken: set for an entry engine that takes tools: the tool calls it writes go to
            the caller only, and of their outputs only these fields (its ``replace``
            outputs) reach the stages after it (:mod:`~omni_actors.actors.stage.spoken`).
        router: the stage's routes to its receivers: a target that takes steps
            (``Target.steps``) gets this session's chunks with the other sessions' of
            the same turn (``omni_actors.actors.stage.steps``), through the device
            link to it when its edge takes the ``device`` path.
    """

    def __init__(
        self,
        stage: str,
        engine: Engine,
        prewarm: Prewarm,
        on_end: Callable[[StageSession], None],
        clock: Clock,
        tasks: TaskScope,
        *,
        outputs: Collection[str],
        takes_marks: bool = False,
        spoken: Collection[str] | None = None,
        host_inputs: Collection[str] = (),
        transfers: StageTransfers | None = None,
        device_links: DeviceLinks | None = None,
        router: StepRouter | None = None,
    ) -> None:
        self.stage = stage
        self.takes_marks = takes_marks
        self.spoken = None if spoken is None else frozenset(spoken)
        self.outputs = frozenset(outputs)
        self.host_inputs = frozenset(host_inputs)
        # A Replayable engine tells the session each reply it generated (to replay).
        last_reply = getattr(engine, "last_reply", None) if takes_marks else None
        self._last_reply: Callable[[SessionKey], tuple[int, ...] | None] | None = last_reply
        self._prompt_tokens = engine_prompt_tokens(engine)
        self._max_new_tokens = engine_max_new_tokens(engine)
        self.transfers = transfers
        self.engine = engine
        self.clock = clock
        self._call_at = clock.call_at
        self.key = prewarm.key
        self.owner = prewarm.owner
        self.resumable = prewarm.resumable
        self.deadlines = prewarm.deadlines
        self.sources = prewarm.sources
        self.sequences = {s: ChunkSequence(f"{s} -> {stage}") for s in self.sources}
        self.inflow = Inflow(
            self.key,
            stage,
            prewarm.window,
            {s: prewarm.owner for s in self.sources},  # it passes them on
        )
        wait_s = prewarm.deadlines.inter_chunk_s  # for a credit, as for a chunk
        self.outlets = [
            Outlet(
                self.key,
                stage,
                t.stage,
                t.ref,
                t.fields,
                mode=t.mode,
                window=t.window,
                accumulate=t.accumulate,
                credits=CreditWindow(prewarm.window),
                clock=clock,
                credit_wait_s=wait_s,
            )
            for t in prewarm.targets
        ]
        for outlet, target in zip(self.outlets, prewarm.targets, strict=True):
            link = None
            if (
                transfers is not None
                and device_links is not None
                and target.device_link
                and not outlet.takes_device
            ):
                link = device_links.outgoing(target.stage, target.ref)
            if router is not None and target.steps:
                outlet.use_route(router.route(target.ref, link))
            elif link is not None:
                assert transfers is not None  # a link is made for a GPU stage only
                outlet.use_link(link, transfers)
        self.client: Outlet | None = None  # the caller's, when this stage emits to it
        if prewarm.emit:
            self.client = Outlet(
                self.key,
                stage,
                "client",
                prewarm.owner,
                prewarm.emit,
                ends=False,
                credits=CreditWindow(prewarm.window),
                clock=clock,
                credit_wait_s=wait_s,
                host=True,
            )
            self.outlets.append(self.client)
        for outlet in self.outlets:  # chunks carry the session's segment numbers
            outlet.segment = prewarm.segment
        self._queue: deque[Chunk] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self.segment = prewarm.segment  # the segment (response) being served
        self._cancelled: set[int] = set()  # segments to stop, this one or later
        self._on_end = on_end
        self.metrics = SegmentMetrics()
        self.task = tasks.create_task(self._run(clock.now()), name=f"{stage} session {self.key}")
        self.task.add_done_callback(self._task_ended)

    # -- input side (called from the stage's receive) ---------------------------------

    def deliver(self, chunk: Chunk) -> None:
        """Queue an input chunk: duplicates are dropped, a gap fails the session."""
        sequence = self.sequences.get(chunk.source)
        if sequence is None:
            self._fail(
                ProtocolError(
                    f"stage {self.stage}, session {self.key}: chunk from {chunk.source!r}, "
                    f"which is not on this session's path (expected {list(self.sources)})"
                )
            )
            return
        try:
            fresh = sequence.accept(chunk.seq)
        except ChunkGapError as exc:
            self._fail(exc)
            return
        if not fresh:
            self.metrics.duplicates += 1
            return
        try:
            self.inflow.received(chunk.source)
        except ProtocolError as exc:  # past its window: refused, never queued
            self._fail(exc)
            return
        queue = self._queue
        queue.append(chunk)
        queued = len(queue)
        metrics = self.metrics
        if queued > metrics.queued_max:
            metrics.queued_max = queued
        self._wake()

    @property
    def queued(self) -> int:
        """Input chunks waiting for the engine (at most a window per source)."""
        return len(self._queue)

    def credit(self, receiver: str, n: int) -> None:
        """``receiver`` has taken ``n`` more of this session's chunks (a ``StreamCredit``)."""
        for outlet in self.outlets:
            if outlet.name == receiver:
                outlet.grant(n)
                return
        log.debug(
            "%s: credit from %r, not a receiver of session %s", self.stage, receiver, self.key
        )

    def fail(self, error: BaseException) -> None:
        """End the session with ``error`` (an input that cannot be read)."""
        self._fail(error)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_chunk(
        self, deadline: float, waiting_for: str, limit: float, setting: str
    ) -> Chunk:
        """The next input chunk, waiting until the clock time ``deadline`` at most."""
        while not self._queue:
            if self._error is not None:
                raise self._error
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            started = time.monotonic()
            # A timer on the waiter, not asyncio.timeout: this runs once per chunk.
            timer = self._call_at(deadline, _expire, waiter)
            try:
                await waiter
            except TimeoutError:
                raise DeadlineExceededError(
                    self.stage, self.key, waiting_for, limit, setting
                ) from None
            finally:
                timer.cancel()
                self._waiter = None
                self.metrics.blocked += time.monotonic() - started
        if self._error is not None:
            raise self._error
        chunk = self._queue.popleft()
        self.metrics.took(max(0.0, time.monotonic() - chunk.sent_at))
        due = self.inflow.taken(chunk.source)
        if due:
            await self.inflow.grant(chunk.source, due)
        return chunk

    # -- the session's task ------------------------------------------------------------

    def abort(self) -> None:
        """Cancel the session's task; it frees the session on the engine as it ends.

        Returns at once: the engine's ``abort`` runs in the session's own task, so a slow
        one holds up no other session on the stage. Its chunks not sent yet are dropped.
        """
        for outlet in self.outlets:
            outlet.closed = True
        self.task.cancel()

    def cancel(self, segment: int) -> None:
        """Stop the reply of ``segment`` at the engine's next output; keep the session.

        A segment not started yet is stopped as it starts (after its first output: an
        engine's first output may carry state later stages need, such as the talker's
        user turn). An engine that takes turn marks is stopped only once it has read
        the segment's whole input (module docstring).
        """
        if segment >= self.segment:
            self._cancelled.add(segment)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        self._on_end(self)

    async def _run(self, started: float) -> None:
        total = timeout_at(self.clock, started + self.deadlines.total_s)
        finished = False
        try:
            async with total:
                start = started
                while True:
                    segment = self.segment
                    end, reply = await self._segment(segment, start)
                    await self._report(
                        segment, "finished" if end == "finished" else "segment", reply=reply
                    )
                    if end == "finished":
                        finished = True
                        break
                    self._cancelled.discard(segment)
                    self.segment = segment + 1
                    start = self.clock.now()
        except Exception as exc:
            engine = isinstance(exc, _EngineFailed)
            error = exc.error if isinstance(exc, _EngineFailed) else exc
            if total.expired():
                error = DeadlineExceededError(
                    self.stage, self.key, "end of the session", self.deadlines.total_s, "total_s"
                )
            await self._report_error(self.segment, error, _cause(error, engine=engine))
        finally:
            # Runs on abort (cancellation) too: nothing of the session stays allocated.
            # The one place the engine frees the session: each session is released or
            # aborted exactly once.
            if finished:
                await self.engine.release(self.key)
            else:
                await self.engine.abort(self.key)

    async def _segment(self, segment: int, start: float) -> tuple[End, tuple[int, ...] | None]:
        """Serve one segment: how it ended, and the reply a ``Replayable`` engine
        generated in it. An engine failure in a conversation fails the response only
        (see the module docstring); anything else that goes wrong ends the session."""
        inputs = SegmentInputs(self, start)
        reply = None
        if await inputs.has_payload():
            failure = await self._generate(segment, inputs)
            if failure is None and self._last_reply is not None:
                reply = self._last_reply(self.key)
            if failure is None and self._prompt_tokens is not None:
                self.metrics.prompt_tokens = self._prompt_tokens(self.key)
            if failure is None and self._max_new_tokens is not None:
                self.metrics.limit = inputs.options.max_tokens or self._max_new_tokens
            if failure is not None:
                if not self.resumable:
                    raise _EngineFailed(failure)  # a one-shot session has nothing left
                # Told at once, so the owner stops the response on every stage; the
                # segment's end is reported as usual once its input has drained.
                await self._report(segment, "failed", failure, _cause(failure, engine=True))
        async for _ in inputs.drain():  # the engine may stop reading early
            pass
        for outlet in self.outlets:
            await outlet.flush(inputs.end)
        return inputs.end, reply

    async def _generate(self, segment: int, inputs: SegmentInputs) -> Exception | None:
        """Run the engine over one segment's inputs, routing its outputs as they come,
        until they end or the segment is cancelled; the engine's failure is returned
        (an output it may not yield, or no first output in time, included)."""
        outputs = self.engine.generate(self.key, inputs)
        cancelled = self._cancelled
        declared = self.outputs
        monotonic = time.monotonic
        # With no device transfers (a CPU stage), route here: no coroutine per output.
        outlets = self.outlets if self.transfers is None else None
        spoken = None if self.spoken is None else SpokenOutputs(self.spoken)
        if spoken is not None:
            outlets = None  # routed by _route_spoken
        first = True
        try:
            while True:
                metrics = self.metrics  # a new segment's after a report
                before, blocked = monotonic(), metrics.blocked
                try:
                    if first:
                        output = await self._first_output(outputs, inputs)
                        first = False
                    else:
                        output = await outputs.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    return exc
                if (
                    type(output) is not dict
                    or not output.keys() <= declared
                    or not values_fit(output)
                ):
                    error = output_error(self.engine, output, declared)
                    if error is not None:
                        await _throw(outputs, error)
                        return error
                now = monotonic()
                metrics.compute += now - before - (metrics.blocked - blocked)
                metrics.output(now, output.get("token_ids"))
                if spoken is not None:
                    await self._route_spoken(output, spoken.feed(output))
                elif outlets is None:
                    await self._route(output)
                else:
                    for outlet in outlets:
                        pending = outlet.push(output)
                        if pending is not None:  # a send that must wait
                            await pending
                if segment in cancelled and (inputs.all_read or not self.takes_marks):
                    break
            if spoken is not None:
                await self._route_spoken(None, spoken.flush())
        finally:
            aclose = getattr(outputs, "aclose", None)
            if aclose is not None:
                # Closing at a yield is how a reply is cancelled: the engine keeps its
                # state as it stands after the last output it yielded.
                await aclose()
        return None

    async def _first_output(self, outputs: AsyncIterator[Fields], inputs: SegmentInputs) -> Fields:
        """The engine's first output of the segment, due ``first_chunk_s`` after the last
        input it took (nothing is due while it waits for input).

        A hung engine fails its reply here, as one that raises does, and the session
        goes on: its ``generate`` is cancelled at the await where it hangs.

        Raises:
            DeadlineExceededError: no output in time.
            StopAsyncIteration: the engine ended the segment without output.
        """
        limit = self.deadlines.first_chunk_s
        deadline = timeout_at(self.clock, self.clock.now() + limit)
        inputs.first_output = deadline
        try:
            async with deadline:
                return await outputs.__anext__()
        except TimeoutError:
            if not deadline.expired():
                raise
            cls = type(self.engine)
            raise DeadlineExceededError(
                self.stage,
                self.key,
                f"first output from engine {cls.__module__}:{cls.__qualname__} "
                "since its last input",
                limit,
                "first_chunk_s",
            ) from None
        finally:
            inputs.first_output = None

    async def _route(self, output: Fields, outlets: Iterable[Outlet] | None = None) -> None:
        """Push ``output`` through every outlet (or those of ``outlets``); device tensors
        reach outlets to other processes (and the caller) as host copies, made once, off
        the compute stream."""
        host: Fields | None = None
        copy_wait = 0.0  # each outlet to the host waited for the one copy
        transfers = self.transfers
        targets = self.outlets if outlets is None else tuple(outlets)
        for outlet in targets:
            if transfers is None or outlet.takes_device:
                pending = outlet.push(output)
            else:
                if host is None:
                    # Only the fields the host-bound outlets take cross to the host: the
                    # caller's text must not wait for the copy of rows meant for a stage
                    # on this device (a copy also waits for the step that made them).
                    wanted = frozenset[str]().union(
                        *(o.fields for o in targets if not o.takes_device)
                    )
                    host = {name: value for name, value in output.items() if name in wanted}
                    if on_device(host):
                        started = time.monotonic()
                        host = await transfers.to_host(host)
                        copy_wait = time.monotonic() - started
                outlet.copy_wait += copy_wait
                pending = outlet.push(host)
            if pending is not None:  # a send that must wait (see ``Outlet.push``)
                await pending

    async def _route_spoken(self, output: Fields | None, voiced: list[Fields]) -> None:
        """Push ``output`` to the caller and what ``SpokenOutputs`` lets go on of it (and
        of outputs it held) to the stages after this one."""
        if output is not None and len(voiced) == 1 and voiced[0] is output:
            await self._route(output)  # said as it came: to every outlet
            return
        client = self.client
        if output is not None and client is not None:
            await self._route(output, (client,))
        if voiced:
            after = [outlet for outlet in self.outlets if outlet is not client]
            for out in voiced:
                await self._route(out, after)

    async def _report(
        self,
        segment: int,
        end: ReportEnd,
        error: BaseException | None = None,
        failure: FailureCause | None = None,
        reply: tuple[int, ...] | None = None,
    ) -> None:
        metrics = self.metrics.report({o.name: o.metrics() for o in self.outlets})
        self.metrics = SegmentMetrics(len(self._queue))
        for outlet in self.outlets:
            outlet.reset_metrics()
        report = StageReport(
            key=self.key,
            stage=self.stage,
            segment=segment,
            end=end,
            metrics=metrics,
            # Our own failures are OmniErrors with their code: anything else came out of
            # the engine (or the outputs it produced).
            code=error_code(error, default="engine_error") if error is not None else None,
            error_type=qualified_name(error) if error is not None else "",
            error=str(error) if error is not None else "",
            reply=reply,
            failure=failure,
        )
        await self.owner.tell(report)

    async def _report_error(
        self, segment: int, error: BaseException, failure: FailureCause
    ) -> None:
        log.debug("session %s failed on %s (%s): %r", self.key, self.stage, failure, error)
        # If the owner is gone, nobody is waiting for this session any more.
        with contextlib.suppress(ActorStoppedError):
            await self._report(segment, "error", error, failure)


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

    @property
    def all_read(self) -> bool:
        """Whether every source has ended the segment: the engine took its whole input."""
        return len(self.ended) >= len(self.session.sources)

    @property
    def at_hand(self) -> bool:
        """Whether the next read returns without waiting for a chunk to come
        (``omni_actors.actors.engines.contract.input_at_hand``)."""
        return self._first is not None or self.all_read or bool(self.session.queued)

    @property
    def output_overdue(self) -> bool:
        """Whether the engine's first output is overdue: the stage is cancelling its
        ``generate`` (``omni_actors.actors.engines.contract.output_overdue``)."""
        deadline = self.first_output
        return deadline is not None and deadline.expired()

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
                        elif chunk.mark == "reply" and "text" in chunk.texts:
                            marked["text"] = chunk.texts["text"]  # a turn given by its words
                        elif chunk.mark == "reply" and TOOL_CALLS_FIELD in chunk.texts:
                            # a turn given by its words and the tools it called
                            marked[TOOL_CALLS_FIELD] = chunk.texts[TOOL_CALLS_FIELD]
                        return marked
                    continue
                if chunk.has_payload:
                    fields: dict[str, Any] = chunk.fields()
                    if s.transfers is not None:
                        fields = s.transfers.load(fields, host=s.host_inputs)
                    if chunk.context:
                        fields[CONTEXT_FIELD] = torch.tensor(chunk.context)
                    return fields
            raise StopAsyncIteration
        finally:
            if deadline is not None:
                s = self.session
                deadline.reschedule(s.clock.now() + s.deadlines.first_chunk_s)


class _EngineFailed(Exception):
    """The engine's failure ending a one-shot session, on its way to ``_run``'s report
    (which tells it from the stage's own failures by this wrapper)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _cause(error: BaseException, *, engine: bool) -> FailureCause:
    """Where ``error`` came from (see ``FailureCause``); ``engine``: out of the engine.

    The stage's own errors of a session's streams are what they are wherever they
    surface (an engine that reads a broken input stream raises the stream's error).
    Outside the engine, a session's task sends only on the session's streams (chunks,
    credits) and to its owner: an actor that stopped, or whose process died, is a peer
    gone.
    """
    if isinstance(error, ChunkGapError):
        return "chunk_gap"
    if isinstance(error, DeadlineExceededError | BackpressureError):
        return "timeout"
    if engine:
        return "engine"
    if isinstance(error, ActorStoppedError | WorkerDiedError):
        return "peer_gone"
    return "internal"


async def _throw(outputs: AsyncIterator[Fields], error: EngineOutputError) -> None:
    """Raise ``error`` in the engine's ``generate`` at the ``yield`` it stopped at: the
    reply failed there, so the engine rolls it back as after a failure of its own."""
    athrow = getattr(outputs, "athrow", None)
    if athrow is None:
        return  # not a generator: closing it is all there is
    try:
        await athrow(error)
    except (StopAsyncIteration, EngineOutputError):
        pass
    except Exception as exc:  # the reply failed already: this is only logged
        log.debug("engine raised %r after its output was refused", exc)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
