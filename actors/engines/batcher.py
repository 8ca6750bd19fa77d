"""``Batcher``: the pending requests of many sessions in one model call.

Cross-session batching for torch engines. A session submits a request (a thinker's next
token, a talker's next frame, a code2wav window) and awaits its future; one batcher task
takes a batch of the live pending requests, at most ``max_batch``, runs it in one call
in the engine's model thread, and resolves each future with its row. A request submitted
while a call runs joins a later one, so nobody waits for a batch to fill, and sessions
working at the same pace share forwards: ``n`` sessions cost about one forward per step
instead of ``n``.

Which requests share a call is the grouping rule, a parameter:

- *step batches* (``group_by=None``, the default): every live request, oldest first.
  Autoregressive steps pad to one shape (the caches are left-padded), so any mix batches.
- *equal-key windows* (``group_by=key``): the oldest live request and every live one
  with the same ``key(request)``, in their order. code2wav windows group by length: the
  decoder has no mask, and right-padding, though harmless to the emitted samples of a
  causal model, would change the held-back tail. Steady-state windows share one length,
  so sessions speaking at once share forwards; the others wait for a later call.

An idle batcher that is woken waits ``wait_s`` (at least one loop turn) before its first
call, to gather sessions that start together. After each call it lets the event loop
turn once before it looks again: a session awaiting its result wakes in that turn and,
if it has more to do, submits its next request, which then joins whatever else is
waiting. Without that turn, sessions answered by one call and those that queued during
it settle into two half batches that alternate.

A request whose future is cancelled (its session ended) is skipped, or its row's result
dropped. A failed call fails its rows' futures, not the batcher nor other batches.
:meth:`Batcher.stop` runs what is queued before it ends, as a model thread finishes its
queue (a session told to end waits for its request, sees it should end, and does not
submit again); a request submitted to a stopped batcher, or left when a cancelled
``stop`` ends the task, fails with :class:`BatcherStoppedError`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from omni_actors.errors import EngineError

__all__ = ["Batcher", "BatcherStoppedError"]

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")


class BatcherStoppedError(EngineError):
    """A request was submitted to an engine that is stopping or stopped: start the
    engine (or wait for its restart) before generating."""


@dataclass(eq=False, slots=True)
class _Pending(Generic[R, T]):
    request: R
    key: Hashable  # the grouping key, computed once at submit
    future: asyncio.Future[T]


class Batcher(Generic[R, T]):
    """See the module docstring.

    Args:
        run: ``run(requests)`` runs one call over ``requests`` (in the engine's model
            thread) and returns one result per request, in order.
        max_batch: the most requests per call: bounds a call's latency and memory (a
            session's request waits at most for the calls ahead of it).
        group_by: the grouping rule: None for step batches (any live requests share a
            call), else the key that requests sharing a call must have in common.
        wait_s: how long an idle batcher gathers before its first call.
        name: the batcher task's name, for debugging.

    Attributes:
        calls: calls run so far.
        requests: requests run so far (``requests / calls`` is the mean batch).
        largest: the largest batch run so far.
    """

    def __init__(
        self,
        run: Callable[[list[R]], Awaitable[list[T]]],
        *,
        max_batch: int,
        group_by: Callable[[R], Hashable] | None = None,
        wait_s: float = 0.0,
        name: str = "batcher",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self._run = run
        self.max_batch = max_batch
        self.group_by = group_by
        self.wait_s = wait_s
        self.name = name
        self.calls = self.requests = self.largest = 0
        self._queue: deque[_Pending[R, T]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def running(self) -> bool:
        """Whether :meth:`start` was called and :meth:`stop` not yet."""
        return self._task is not None and not self._closing

    def start(self) -> None:
        """Start the batcher task (owned by this object; :meth:`stop` ends it)."""
        if self._task is None:
            self._closing = False
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        """Run what is queued, then end the batcher task.

        Tell the sessions to end first (they must not submit again); a request submitted
        from now on fails with :class:`BatcherStoppedError`. If the caller is cancelled
        meanwhile, the task is cancelled and the requests left fail the same way.
        """
        task = self._task
        if task is None:
            return
        self._closing = True
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
            self._fail_queued()
            log.debug(
                "%s: %d requests in %d calls (largest %d)",
                self.name,
                self.requests,
                self.calls,
                self.largest,
            )

    def submit(self, request: R) -> asyncio.Future[T]:
        """Queue ``request``; the future gets its result, or the call's error. Cancel the
        future to withdraw the request."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if not self.running:
            future.set_exception(BatcherStoppedError(f"{self.name} is not running"))
            return future
        key = None if self.group_by is None else self.group_by(request)
        self._queue.append(_Pending(request, key, future))
        self._wake.set()
        return future

    async def _loop(self) -> None:
        """Run whatever is pending, one call per batch, until stopped."""
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            # Sessions woken by the same event (or call) submit within a few loop turns.
            await asyncio.sleep(0 if self._closing else self.wait_s)
            while batch := self._take():
                await self._call(batch)
                # One loop turn: the sessions just answered resubmit (module docstring).
                await asyncio.sleep(0)

    def _take(self) -> list[_Pending[R, T]]:
        """The oldest live request and up to ``max_batch - 1`` live ones of its key (any
        key for step batches); the rest stay queued in order, the withdrawn are dropped."""
        batch: list[_Pending[R, T]] = []
        rest: deque[_Pending[R, T]] = deque()
        while self._queue:
            pending = self._queue.popleft()
            if pending.future.done():
                continue
            if not batch or (len(batch) < self.max_batch and pending.key == batch[0].key):
                batch.append(pending)
            else:
                rest.append(pending)
                if len(batch) == self.max_batch:
                    break  # the batch is full: what is left stays as it is
        rest.extend(self._queue)
        self._queue = rest
        return batch

    async def _call(self, batch: list[_Pending[R, T]]) -> None:
        self.calls += 1
        self.requests += len(batch)
        self.largest = max(self.largest, len(batch))
        try:
            results = await self._run([pending.request for pending in batch])
            if len(results) != len(batch):
                raise RuntimeError(
                    f"{self.name}: {len(batch)} requests gave {len(results)} results"
                )
        except asyncio.CancelledError:  # stop() was cancelled: nobody runs these rows
            for pending in batch:
                _fail(pending.future, BatcherStoppedError(f"{self.name} stopped mid-call"))
            raise
        except Exception as exc:  # a failed call fails its rows' sessions, not the batcher
            for pending in batch:
                _fail(pending.future, exc)
            return
        for pending, result in zip(batch, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)

    def _fail_queued(self) -> None:
        while self._queue:
            _fail(self._queue.popleft().future, BatcherStoppedError(f"{self.name} stopped"))


def _fail(future: asyncio.Future[T], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
