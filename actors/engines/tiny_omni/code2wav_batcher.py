"""``WindowBatcher``: code2wav windows of many sessions decoded together.

Sessions submit windows and await their futures; one batcher task takes the oldest live
request plus every live one of the same window length (up to ``max_batch``) and decodes
them in one forward. Equal lengths only: code2wav has no mask, and right-padding, though
harmless to the emitted samples of a causal model, would change the held-back tail.
Steady-state windows (25 + 25 frames) share one length, so sessions speaking at once
share forwards; requests arriving during a forward join the next. ``wait_s`` holds an
idle batcher before its first forward to gather sessions that start together. A request
whose future is cancelled (its session ended) is skipped, or its row dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

__all__ = ["WindowBatcher"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class _Request(Generic[T]):
    codes: torch.Tensor  # [Q, T]
    start: int
    future: asyncio.Future[T]


class WindowBatcher(Generic[T]):
    """See the module docstring.

    Args:
        decode: ``decode(codes [B, Q, T], starts)`` runs one forward over a batch (in the
            engine's model thread) and returns a result per row.
        max_batch: the most windows per forward.
        wait_s: how long an idle batcher gathers before its first forward.
    """

    def __init__(
        self,
        decode: Callable[[torch.Tensor, list[int]], Awaitable[list[T]]],
        *,
        max_batch: int,
        wait_s: float,
    ) -> None:
        self._decode = decode
        self.max_batch = max_batch
        self.wait_s = wait_s
        self._queue: deque[_Request[T]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """Whether :meth:`start` was called and :meth:`stop` not yet."""
        return self._task is not None

    def start(self) -> None:
        """Start the batcher task (owned by this object; :meth:`stop` ends it)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="code2wav batcher"
            )

    async def stop(self) -> None:
        """End the batcher task; queued and in-flight requests are cancelled."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait((task,))
            if not task.cancelled() and task.exception() is not None:
                log.error("code2wav batcher had failed", exc_info=task.exception())
        for request in self._queue:
            request.future.cancel()
        self._queue.clear()

    def submit(self, codes: torch.Tensor, start: int) -> asyncio.Future[T]:
        """Queue window ``codes`` [Q, T], to be emitted from sample ``start``; the future
        gets its row's result, or the forward's error. Cancel it to withdraw the request."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(codes, start, future))
        self._wake.set()
        return future

    async def _loop(self) -> None:
        """Decode whatever is pending, one same-length group per forward, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Sessions woken by the same event (or forward) submit within a few loop turns.
            await asyncio.sleep(self.wait_s)
            while group := self._take_group():
                await self._run_group(group)

    def _take_group(self) -> list[_Request[T]]:
        """The oldest live request and up to ``max_batch - 1`` live ones of its length."""
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()
        if not self._queue:
            return []
        length = self._queue[0].codes.shape[-1]
        group: list[_Request[T]] = []
        rest: deque[_Request[T]] = deque()
        for request in self._queue:
            if request.future.done():
                continue
            if len(group) < self.max_batch and request.codes.shape[-1] == length:
                group.append(request)
            else:
                rest.append(request)
        self._queue = rest
        return group

    async def _run_group(self, group: list[_Request[T]]) -> None:
        codes = torch.stack([r.codes for r in group])
        try:
            pieces = await self._decode(codes, [r.start for r in group])
        except asyncio.CancelledError:  # stopped mid-forward: nobody waits on these rows
            for request in group:
                request.future.cancel()
            raise
        except Exception as exc:  # a failed forward fails its rows' sessions, not the batcher
            for request in group:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        for request, piece in zip(group, pieces, strict=True):
            if not request.future.done():
                request.future.set_result(piece)
