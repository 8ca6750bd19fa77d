"""``StepBatcher``: the next step of every waiting session in one model call.

Continuous batching for autoregressive engines. A session submits its next step (a
talker frame, a thinker token) and awaits its future; one batcher task takes every live
pending step, oldest first and at most ``max_batch``, and runs them in one call in the
engine's model thread. A session that submits while a call runs joins the next one, so
nobody waits for a batch to fill, and sessions stepping at the same pace share forwards:
``n`` sessions cost about one forward per step instead of ``n``.

After each call the batcher lets the event loop turn once before it looks again: a
session awaiting its step wakes in that turn and, if it has more to do, submits its next
step, which then joins whatever else is waiting. Without that turn, sessions answered by
one call and those that queued during it settle into two half batches that alternate.

A step whose future is cancelled (its session ended) is skipped, or its row's result
dropped. A failed call fails its rows' sessions, not the batcher. :meth:`StepBatcher.stop`
runs what is queued before it ends, as a model thread finishes its queue: a session told
to end waits for its step, sees it should end, and does not submit again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from omni_actors.errors import EngineError

__all__ = ["BatcherStoppedError", "StepBatcher"]

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")


class BatcherStoppedError(EngineError):
    """A step was submitted to an engine that is stopping or stopped: start the engine
    (or wait for its restart) before generating."""


@dataclass(eq=False, slots=True)
class _Pending(Generic[R, T]):
    step: R
    future: asyncio.Future[T]


class StepBatcher(Generic[R, T]):
    """See the module docstring.

    Args:
        run: ``run(steps)`` runs one call over ``steps`` (in the engine's model thread)
            and returns one result per step, in order.
        max_batch: the most steps per call: bounds a call's latency and memory (a
            session's step waits at most for the calls ahead of it).
        name: the batcher task's name, for debugging.

    Attributes:
        calls: calls run so far.
        steps: steps run so far (``steps / calls`` is the mean batch).
        largest: the largest batch run so far.
    """

    def __init__(
        self,
        run: Callable[[list[R]], Awaitable[list[T]]],
        *,
        max_batch: int,
        name: str = "step batcher",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._run = run
        self.max_batch = max_batch
        self.name = name
        self.calls = self.steps = self.largest = 0
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

        Tell the sessions to end first (they must not submit again); a step submitted
        from now on fails with :class:`BatcherStoppedError`. If the caller is cancelled
        meanwhile, the task is cancelled and the steps left fail the same way.
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
                "%s: %d steps in %d calls (largest %d)",
                self.name,
                self.steps,
                self.calls,
                self.largest,
            )

    def submit(self, step: R) -> asyncio.Future[T]:
        """Queue ``step``; the future gets its result, or the call's error. Cancel the
        future to withdraw the step."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if not self.running:
            future.set_exception(BatcherStoppedError(f"{self.name} is not running"))
            return future
        self._queue.append(_Pending(step, future))
        self._wake.set()
        return future

    async def _loop(self) -> None:
        """Run whatever is pending, one call per batch, until stopped."""
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            while batch := self._take():
                await self._call(batch)
                # One loop turn: the sessions just answered resubmit (module docstring).
                await asyncio.sleep(0)

    def _take(self) -> list[_Pending[R, T]]:
        """The oldest ``max_batch`` live steps."""
        batch: list[_Pending[R, T]] = []
        while self._queue and len(batch) < self.max_batch:
            pending = self._queue.popleft()
            if not pending.future.done():
                batch.append(pending)
        return batch

    async def _call(self, batch: list[_Pending[R, T]]) -> None:
        self.calls += 1
        self.steps += len(batch)
        self.largest = max(self.largest, len(batch))
        try:
            results = await self._run([pending.step for pending in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{self.name}: {len(batch)} steps gave {len(results)} results")
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
