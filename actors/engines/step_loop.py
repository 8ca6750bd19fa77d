"""``StepLoop``: the serving loop of an autoregressive torch stage.

One loop per engine owns every session's request state as data (:class:`Request`: its
KV slot, how many positions the slot holds, the work queued on it) and runs the model
in steps shaped as vLLM v1's engine core runs them:

1. *schedule*: one row from every request whose next work is a decode (a single
   position), then prefill chunks of requests whose next work is a prefill, oldest
   first, while the step's token budget lasts (``max_tokens_per_step``), at most
   ``max_chunk`` positions per request, so a long prompt never holds the running
   sessions' decode back for more than one chunk; a request's prefills queued back to
   back (a prompt, then the reply's opening) run in the same step, in order; a request
   with urgent work queued (``submit(urgent=True)``: an output someone waits for) goes
   before the others' prefills, and a step with urgent work takes no other request's
   prefill (work queued ahead of need, a talker's user rows sent before their reply,
   would make what is waited for wait for it; a reply's opening holds those of its rows
   not yet prefilled); under
   ``whole_fresh_prefills`` a prompt that would start its slot and fits one chunk is
   not split by what is left of the budget (the model replays a graph per such
   prompt, and the part left over would cost a forward of its own): it waits for the
   next step, and so does every younger prompt; with ``decode_ahead``, a step that
   would run other requests' prefill chunks beside the decode row of a young reply
   (one of the first ``decode_ahead`` decode rows after its request's last prefill)
   runs the decode rows alone first, and the prefills with the next step's rows after
   it (below);
2. *execute*: the whole step is one call of the model (one forward over every row and
   chunk), in the engine's model thread;
3. *update*: each request's computed length moves on by what the step fed it, each
   chunk's output joins its work, and a work whose last chunk ran resolves its future
   with the outputs of all its chunks.

The model side (what a work's payload is, how a step is computed) is the engine's: the
loop only counts positions. A request waits in the loop only while it has work; a
session between responses holds its request (and so its slot) but costs no step.

Why ``decode_ahead``: a reply's first outputs are what someone waits for (a talker's
first audio packet needs its thinker's first few tokens), and a decode row beside a
wave's prompts gets its token only when their whole forward ends (at full size, three
2500-position prompts take about 130 ms). A decode-only step ahead of such a step gives
every decode row its token at once (a step of rows costs a fraction of a prompt's), and
the step after it runs the prefills with the rows queued by then: each young reply
gets two tokens in that pair of steps instead of one, its first ones sooner, for the
decode step's time added to the prompts' (their first tokens come that much later).
Never two such steps in a row, so prefills always advance.

Work submitted while a step runs joins the next one. After each step the loop lets the
event loop turn twice, so that a session woken by the step's results can queue its next
work before the next schedule: without that, sessions answered by one step and those
that queued during it settle into two half steps that alternate. Twice, because a
session that awaits its work through ``asyncio.shield`` (an engine's ``feed``: a cancel
of the caller leaves the work running) wakes a turn after the work resolves; with one
turn its next work (a reply's first decode row after its prompt) missed the next step and
waited for the one after, a whole prefill step in a wave of prompts. An idle loop
that is woken may gather for ``wait_s`` before its first step, so sessions that start
together share it. A request's computed length is only moved by the loop itself (the step's
update) and by :meth:`StepLoop.rewind` (a clear, a rollback or a truncation), which
takes effect in the request's order: at once if nothing is queued or running on it,
else after the work queued before it, so a session that moves on from a step it gave
up (a cancelled frame still in the running step) needs no wait.

A closed request's queued work fails with :class:`RequestClosedError`; a chunk of it in
the step that is running is computed and dropped. Its slot goes back to the free list
only once no running step holds it. A failed step fails the works that had a chunk in
it (their requests may hold partly written positions past ``computed``: nothing reads
them, and the next work overwrites them), not the loop.

Where :data:`STEP_TRACE_ENV` names a directory (``OMNI_ACTORS_STEP_TRACE=DIR omni-actors
bench pipeline ...``; worker processes inherit it), every loop writes each step there as
one JSON line, to ``<name>-<pid>.jsonl``: when it started (``t``, Unix seconds), how long
it took (``ms``), the requests it gave a decode row (``decode``) and the prefill chunks
it ran (``prefill``: request, start position, length). Merged by ``t``, the files of a
run are a timeline of every stage's steps and of each session through them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Generic, TextIO, TypeVar, cast

from omni_actors.errors import EngineError

__all__ = [
    "STEP_TRACE_ENV",
    "Chunk",
    "ContextLengthError",
    "Request",
    "RequestClosedError",
    "SlotsExhaustedError",
    "StepLoop",
    "StepLoopStats",
    "Work",
]

log = logging.getLogger(__name__)

_TURNS_AFTER_STEP: Final = 2
"""Turns of the event loop after a step, before the next schedule (module docstring)."""

STEP_TRACE_ENV: Final = "OMNI_ACTORS_STEP_TRACE"
"""The environment variable naming the directory step loops trace their steps to."""

P = TypeVar("P")
Out = TypeVar("Out")


class SlotsExhaustedError(EngineError):
    """Every KV slot of the stage is held by a session: raise the stage's
    ``max_sessions`` (KV memory is planned from it at load) or admit fewer sessions."""


class ContextLengthError(EngineError):
    """A conversation outgrew its KV slot: raise the stage's ``max_context``, or start a
    new conversation."""


class RequestClosedError(EngineError):
    """The request was closed (its session aborted or released) before its work ran."""


@dataclass(eq=False, slots=True)
class Work(Generic[P, Out]):
    """Positions to feed one request, with the model's payload for them."""

    payload: P
    length: int
    """Positions this work feeds (1 for a decode step)."""
    decode: bool
    future: asyncio.Future[list[Out]]
    rewind: int | None = None
    """A rewind queued behind earlier work: applied when reached (feeds nothing)."""
    done: int = 0
    """Positions fed so far (a prefill runs in chunks)."""
    outputs: list[Out] = field(default_factory=list)
    submitted: float = 0.0
    """When it was queued (the loop's clock): its first chunk's wait counts from here."""
    urgent: bool = False
    """Its request's prefills go before other requests' (``StepLoop.submit``)."""


@dataclass(eq=False, slots=True)
class Request(Generic[P, Out]):
    """One session's state in the loop: owned by the loop, read by the engine."""

    id: str
    slot: int
    computed: int = 0
    """Positions the slot holds: the next work is fed from here."""
    queue: deque[Work[P, Out]] = field(default_factory=deque)
    closed: bool = False
    stepping: int = 0
    """Chunks of this request in the step now running."""
    young: int = 0
    """Decode rows left before its reply is no longer young (``decode_ahead``): set by
    each prefill work that completes, one less per decode row."""


@dataclass(frozen=True, slots=True)
class Chunk(Generic[P, Out]):
    """What one step feeds one request: ``length`` positions of ``work`` from its
    ``offset``, at positions ``start ..`` of ``request.slot``."""

    request: Request[P, Out]
    work: Work[P, Out]
    offset: int
    length: int
    start: int

    @property
    def last(self) -> bool:
        """Whether this chunk ends its work (its output completes the work)."""
        return self.offset + self.length == self.work.length


@dataclass(frozen=True, slots=True)
class StepLoopStats:
    """What the loop has done so far (one frozen reading)."""

    steps: int
    decode_rows: int
    prefill_chunks: int
    prefill_tokens: int
    largest_step: int
    """The most rows (decode rows plus prefill chunks) one step ran."""
    mixed_steps: int
    """Steps that ran decode rows and prefill chunks together."""
    requests: int
    free_slots: int
    prefill_steps: int = 0
    """Steps that ran prefill chunks (with decode rows or not)."""
    step_s: float = 0.0
    """Seconds spent in steps (the model's calls, awaited)."""
    prefill_step_s: float = 0.0
    """Of ``step_s``, the seconds of steps that ran prefill chunks."""
    prefill_works: int = 0
    """Prefills whose first chunk has run."""
    ahead_steps: int = 0
    """Decode-only steps run ahead of prefill chunks for young replies (``decode_ahead``)."""
    prefill_wait_s: float = 0.0
    """Their waits summed, each from its submission to the start of the step of its
    first chunk: how long prompts queue before the stage computes them."""
    decode_wait_s: float = 0.0
    """Each decode row's wait summed, from its submission to the start of its step (a
    row queued while a step runs waits for it)."""


class StepLoop(Generic[P, Out]):
    """See the module docstring.

    Args:
        execute: ``execute(chunks)`` runs one step (awaiting the model thread) and
            returns one output per chunk, in order.
        slots: how many requests may be open at once (one KV slot each).
        max_context: the most positions a slot holds.
        max_tokens_per_step: the step's token budget (decode rows count one each).
        max_chunk: the most positions of one prefill fed in one step.
        max_rows: the most decode rows in one step (a graph's largest batch).
        whole_fresh_prefills: leave a request's prefills that start its slot for the
            next step, rather than split them, when they fit one chunk but not the
            budget this step has left (a model that replays a graph per fresh prompt).
        decode_ahead: a reply's first decode rows (this many after its request's last
            prefill) do not wait for other requests' prefill chunks: a step that would
            run them beside such chunks runs the decode rows alone first (module
            docstring); 0: never.
        wait_s: how long an idle loop, once woken, gathers work before its first step.
        name: the loop task's name, for debugging.
        clock: the seconds its statistics' times are read from.
        trace_dir: where to write its steps while it runs (module docstring); None: the
            directory :data:`STEP_TRACE_ENV` names, if set, else nowhere.
    """

    def __init__(
        self,
        execute: Callable[[list[Chunk[P, Out]]], Awaitable[list[Out]]],
        *,
        slots: int,
        max_context: int,
        max_tokens_per_step: int,
        max_chunk: int,
        max_rows: int | None = None,
        whole_fresh_prefills: bool = False,
        decode_ahead: int = 0,
        wait_s: float = 0.0,
        name: str = "step loop",
        clock: Callable[[], float] = time.perf_counter,
        trace_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if min(slots, max_context, max_tokens_per_step, max_chunk) < 1:
            raise ValueError(
                "slots, max_context, max_tokens_per_step and max_chunk must be >= 1, got "
                f"{slots}, {max_context}, {max_tokens_per_step}, {max_chunk}"
            )
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        if decode_ahead < 0:
            raise ValueError(f"decode_ahead must be >= 0, got {decode_ahead}")
        self.wait_s = wait_s
        self._execute = execute
        self._clock = clock
        self.slots, self.max_context, self.name = slots, max_context, name
        self.max_tokens_per_step, self.max_chunk = max_tokens_per_step, max_chunk
        self.max_rows = slots if max_rows is None else max_rows
        self.whole_fresh_prefills = whole_fresh_prefills
        self.decode_ahead = decode_ahead
        self._ahead = False  # the last step was a decode step ahead of prefills
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out the lowest first
        self._requests: dict[str, Request[P, Out]] = {}
        self._waiting: deque[Request[P, Out]] = deque()  # requests with work, oldest first
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._steps = self._decode_rows = self._chunks = self._tokens = 0
        self._largest = self._mixed = self._prefill_steps = self._prefill_works = 0
        self._step_s = self._prefill_step_s = self._prefill_wait_s = self._decode_wait_s = 0.0
        self._ahead_steps = 0
        traced = trace_dir if trace_dir is not None else os.environ.get(STEP_TRACE_ENV)
        self._trace_dir = Path(traced) if traced else None
        self._trace: TextIO | None = None  # open while the loop runs

    # -- requests -----------------------------------------------------------------------

    def open(self, request_id: str) -> Request[P, Out]:
        """A new request with a free slot of its own.

        Raises:
            SlotsExhaustedError: every slot is held.
            ValueError: ``request_id`` is open already.
        """
        if request_id in self._requests:
            raise ValueError(f"{self.name}: request {request_id!r} is open already")
        if not self._free:
            raise SlotsExhaustedError(
                f"{self.name}: all {self.slots} KV slots are held by sessions: raise "
                "max_sessions (KV memory is planned from it at load) or admit fewer sessions"
            )
        request: Request[P, Out] = Request(request_id, self._free.pop())
        self._requests[request_id] = request
        return request

    def close(self, request: Request[P, Out]) -> None:
        """End ``request``: its queued work fails, its slot is freed (once no running
        step holds it)."""
        if request.closed:
            return
        request.closed = True
        self._requests.pop(request.id, None)
        while request.queue:
            _fail(request.queue.popleft().future, RequestClosedError(f"{request.id} closed"))
        if request.stepping == 0:
            self._free.append(request.slot)

    def rewind(self, request: Request[P, Out], position: int) -> None:
        """Forget ``request``'s positions from ``position`` on (a clear, a rollback, a
        truncation): the slot keeps them, nothing reads them, the next work overwrites.
        With work queued or running on the request, it takes effect after that work
        (module docstring), down to at most what the slot then holds.

        Raises:
            ValueError: ``position`` is negative, or past what the slot holds when
                nothing is in flight.
        """
        if position < 0 or (
            not (request.queue or request.stepping) and position > request.computed
        ):
            raise ValueError(f"cannot rewind {request.computed} positions to {position}")
        if request.queue or request.stepping:
            done: asyncio.Future[list[Out]] = asyncio.get_running_loop().create_future()
            request.queue.append(Work(cast(P, None), 0, False, done, rewind=position))
            return
        request.computed = position

    def submit(
        self,
        request: Request[P, Out],
        payload: P,
        length: int,
        *,
        decode: bool = False,
        urgent: bool = False,
    ) -> asyncio.Future[list[Out]]:
        """Queue ``length`` positions of ``payload`` on ``request``; the future gets one
        output per chunk it ran in (a decode: one), or the error of a failed step.
        Cancel the future to withdraw work not started yet. An ``urgent`` prefill (one
        whose output a caller is waiting for, as a reply's first audio waits for the
        talker's opening) takes its request's queue before other requests' prefills,
        older ones included; among urgent requests, and among the rest, oldest first.

        Raises:
            ContextLengthError: the request's slot cannot hold the positions (checked
                against the work already queued).
            RequestClosedError: the request is closed, or the loop is not running.
        """
        future: asyncio.Future[list[Out]] = asyncio.get_running_loop().create_future()
        if request.closed or not self.running:
            raise RequestClosedError(f"{self.name}: {request.id} is closed or the loop stopped")
        if length < 1 or (decode and length != 1):
            raise ValueError(f"a work feeds >= 1 positions (a decode exactly 1), got {length}")
        queued = request.computed + sum(w.length - w.done for w in request.queue) + length
        if queued > self.max_context:
            raise ContextLengthError(
                f"{self.name}: {request.id} would hold {queued} positions, past its slot's "
                f"max_context of {self.max_context}: raise max_context or start a new "
                "conversation"
            )
        work = Work(payload, length, decode, future, submitted=self._clock(), urgent=urgent)
        request.queue.append(work)
        self._waiting.append(request)  # schedule() drops repeats
        self._wake.set()
        return future

    @property
    def requests(self) -> dict[str, Request[P, Out]]:
        """Open requests by id."""
        return dict(self._requests)

    def statistics(self) -> StepLoopStats:
        """The loop's counters now."""
        return StepLoopStats(
            steps=self._steps,
            decode_rows=self._decode_rows,
            prefill_chunks=self._chunks,
            prefill_tokens=self._tokens,
            largest_step=self._largest,
            mixed_steps=self._mixed,
            requests=len(self._requests),
            free_slots=len(self._free),
            prefill_steps=self._prefill_steps,
            step_s=self._step_s,
            prefill_step_s=self._prefill_step_s,
            prefill_works=self._prefill_works,
            ahead_steps=self._ahead_steps,
            prefill_wait_s=self._prefill_wait_s,
            decode_wait_s=self._decode_wait_s,
        )

    # -- the loop -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether :meth:`start` was called and :meth:`stop` not yet."""
        return self._task is not None and not self._closing

    def start(self) -> None:
        """Start the loop task (owned by this object; :meth:`stop` ends it), and open its
        step trace where one is asked for.

        Raises:
            OSError: the trace's directory cannot be made, or its file opened.
        """
        if self._task is None:
            if self._trace_dir is not None and self._trace is None:
                self._trace_dir.mkdir(parents=True, exist_ok=True)
                name = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)
                path = self._trace_dir / f"{name}-{os.getpid()}.jsonl"
                self._trace = path.open("a", encoding="utf-8", buffering=1)
            self._closing = False
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Close every request (their work fails), let a running step end, end the task."""
        task = self._task
        if task is None:
            return
        self._closing = True
        for request in list(self._requests.values()):
            self.close(request)
        self._wake.set()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait((task,))
            raise
        except Exception:
            log.exception("%s had failed", self.name)
        finally:
            self._task = None
            if self._trace is not None:
                self._trace.close()
                self._trace = None

    async def _run(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            if self.wait_s and not self._closing:
                await asyncio.sleep(self.wait_s)  # sessions starting together share a step
            while not self._closing and (chunks := self.schedule()):
                await self._step(chunks)
                for _ in range(_TURNS_AFTER_STEP):
                    await asyncio.sleep(0)  # sessions answered by the step queue their next

    def schedule(self) -> list[Chunk[P, Out]]:
        """The next step: a decode row of every request whose next work is a decode,
        then prefill chunks, oldest first, within the budget (module docstring)."""
        live: deque[Request[P, Out]] = deque()
        seen: set[int] = set()
        for request in self._waiting:
            while request.queue and (request.queue[0].future.done() or _rewinds(request)):
                request.queue.popleft()  # withdrawn, or a rewind now applied
            if request.queue and not request.closed and id(request) not in seen:
                seen.add(id(request))
                live.append(request)
        self._waiting = live
        chunks: list[Chunk[P, Out]] = []
        budget = self.max_tokens_per_step
        for request in live:
            work = request.queue[0]
            if work.decode and len(chunks) < self.max_rows and budget > 0:
                chunks.append(Chunk(request, work, 0, 1, request.computed))
                budget -= 1
        prefills = urgent = False
        # Urgent requests first (sorted is stable: oldest first within each group).
        for request in sorted(live, key=lambda r: not any(w.urgent for w in r.queue)):
            if urgent and not any(w.urgent for w in request.queue):
                break  # what is waited for does not wait for work ahead of need
            urgent = urgent or any(w.urgent for w in request.queue)
            # A request's prefills queued back to back (a turn's prompt, then the reply's
            # opening) share the step: each forward costs a fixed launch overhead on a
            # GPU, whatever its length, and the second would wait a step for nothing.
            room = min(self.max_chunk, budget)
            start = request.computed
            if prefills and self._defer_fresh(request, room):
                break  # oldest first: nothing younger passes it
            for work in request.queue:
                if work.decode or work.rewind is not None or work.future.done() or room <= 0:
                    break
                length = min(work.length - work.done, room)
                chunks.append(Chunk(request, work, work.done, length, start))
                prefills = True
                start += length
                room -= length
                budget -= length
                if work.done + length < work.length:
                    break  # the rest of this work comes in a later step
        return self._ahead_of_prefills(chunks)

    def _ahead_of_prefills(self, chunks: list[Chunk[P, Out]]) -> list[Chunk[P, Out]]:
        """``chunks``, or their decode rows alone where ``decode_ahead`` runs them ahead
        of the prefills: a young reply's row among them, and the last step not such a
        step (module docstring)."""
        rows = sum(chunk.work.decode for chunk in chunks)  # the rows come first
        ahead = (
            self.decode_ahead > 0
            and not self._ahead
            and 0 < rows < len(chunks)
            and any(chunk.request.young for chunk in chunks[:rows])
        )
        self._ahead = ahead
        return chunks[:rows] if ahead else chunks

    def _defer_fresh(self, request: Request[P, Out], room: int) -> bool:
        """Whether ``request``'s prefills start its slot and, whole, fit one chunk but
        not ``room``, under ``whole_fresh_prefills``."""
        if not self.whole_fresh_prefills or request.computed or not request.queue:
            return False
        if request.queue[0].done:
            return False  # already split: the rest is not from the slot's start
        length = 0
        for work in request.queue:
            if work.decode or work.rewind is not None or work.future.done():
                break
            length += work.length
        return room < length <= self.max_chunk

    async def _step(self, chunks: list[Chunk[P, Out]]) -> None:
        for chunk in chunks:
            chunk.request.stepping += 1
        decodes = sum(chunk.work.decode for chunk in chunks)
        self._steps += 1
        self._decode_rows += decodes
        self._chunks += len(chunks) - decodes
        self._tokens += sum(c.length for c in chunks if not c.work.decode)
        self._largest = max(self._largest, len(chunks))
        self._mixed += 0 < decodes < len(chunks)
        started = self._clock()
        began = time.time()
        for chunk in chunks:
            if chunk.work.decode:
                self._decode_wait_s += started - chunk.work.submitted
            elif chunk.offset == 0:
                self._prefill_works += 1
                self._prefill_wait_s += started - chunk.work.submitted
        try:
            outputs = await self._execute(chunks)
            if len(outputs) != len(chunks):
                raise RuntimeError(f"{self.name}: {len(chunks)} chunks gave {len(outputs)}")
        except asyncio.CancelledError:
            self._release(chunks)
            for chunk in chunks:
                _fail(chunk.work.future, RequestClosedError(f"{self.name} stopped mid-step"))
            raise
        except Exception as exc:  # a failed step fails its works, not the loop
            self._release(chunks)
            for chunk in chunks:
                request, work = chunk.request, chunk.work
                if request.queue and request.queue[0] is work:
                    request.queue.popleft()
                _fail(work.future, exc)
            return
        self._release(chunks)
        took = self._clock() - started
        self._step_s += took
        if decodes < len(chunks):
            self._prefill_steps += 1
            self._prefill_step_s += took
        elif self._ahead:
            self._ahead_steps += 1
        if self._trace is not None:
            self._write_trace(chunks, began, took)
        if log.isEnabledFor(logging.DEBUG):  # where a step's time goes, one line per step
            log.debug(
                "%s: step %d, %d decode rows, %d prefill chunks of %d positions, %.1f ms",
                self.name,
                self._steps,
                decodes,
                len(chunks) - decodes,
                sum(c.length for c in chunks if not c.work.decode),
                took * 1e3,
            )
        for chunk, output in zip(chunks, outputs, strict=True):
            self._update(chunk, output)

    def _write_trace(self, chunks: list[Chunk[P, Out]], began: float, took: float) -> None:
        assert self._trace is not None
        step = {
            "t": round(began, 6),
            "ms": round(took * 1e3, 3),
            "loop": self.name,
            "decode": [c.request.id for c in chunks if c.work.decode],
            "prefill": [[c.request.id, c.start, c.length] for c in chunks if not c.work.decode],
        }
        self._trace.write(json.dumps(step) + "\n")

    def _release(self, chunks: list[Chunk[P, Out]]) -> None:
        for chunk in chunks:
            request = chunk.request
            request.stepping -= 1
            if request.closed and request.stepping == 0:
                self._free.append(request.slot)

    def _update(self, chunk: Chunk[P, Out], output: Out) -> None:
        request, work = chunk.request, chunk.work
        if request.closed:
            return
        request.computed = chunk.start + chunk.length
        work.done += chunk.length
        work.outputs.append(output)
        if work.decode:
            request.young = max(request.young - 1, 0)
        if work.done < work.length:
            return
        if not work.decode:
            request.young = self.decode_ahead
        request.queue.popleft()
        if not work.future.done():
            work.future.set_result(work.outputs)


def _rewinds(request: Request[P, Out]) -> bool:
    """Apply the rewind at the head of ``request``'s queue, if one is there."""
    work = request.queue[0]
    if work.rewind is None:
        return False
    request.computed = min(work.rewind, request.computed)
    work.future.set_result([])
    return True


def _fail(future: asyncio.Future[Out], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
