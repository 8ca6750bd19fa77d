"""The system's time source: supervision timers and every pipeline deadline read it.

The runtime never calls ``time`` or ``loop.call_later`` directly for supervision or for
a session's deadlines, so tests can swap in :class:`omni_actors.testing.VirtualClock`
and drive backoff, intensity and deadlines deterministically instead of sleeping.

An actor in a worker process runs in that process's own system, on its real clock: a
deadline enforced there (a stage with ``process: true``) always reads real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

__all__ = ["Clock", "LoopClock", "TimerHandle", "Timeout", "timeout_at"]


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled."""

    def cancel(self) -> None:
        """Prevent the callback from running; a no-op once it has run."""


class Clock(Protocol):
    """Monotonic time plus one-shot timers."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` (synchronously, on the event loop) after ``delay`` seconds."""

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` once :meth:`now` reaches ``when`` (at once if it has)."""


class LoopClock:
    """The running event loop's clock: the production default."""

    def now(self) -> float:
        """Return the event loop's monotonic time."""
        return asyncio.get_running_loop().time()

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> TimerHandle:
        """Schedule ``callback`` on the running loop."""
        return asyncio.get_running_loop().call_later(max(0.0, delay), callback, *args)

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> TimerHandle:
        """Schedule ``callback`` on the running loop at loop time ``when``.

        This sits on the per-chunk path of every stage session: one loop timer, no
        task or context manager.
        """
        return asyncio.get_running_loop().call_at(when, callback, *args)


class Timeout:
    """``asyncio.timeout_at`` on a :class:`Clock`: made by :func:`timeout_at`.

    When the clock reaches the deadline the enclosed block is cancelled and the
    ``async with`` raises ``TimeoutError``. A cancellation that comes from elsewhere
    (the caller's, an abort) passes through unchanged: the task's cancel count tells
    the two apart, as it does for ``asyncio.timeout``.
    """

    __slots__ = ("_cancelling", "_clock", "_expired", "_task", "_timer", "when")

    def __init__(self, clock: Clock, when: float | None) -> None:
        self._clock = clock
        self.when = when
        self._task: asyncio.Task[Any] | None = None
        self._timer: TimerHandle | None = None
        self._expired = False
        self._cancelling = 0

    def expired(self) -> bool:
        """True if the deadline cancelled the block."""
        return self._expired

    def reschedule(self, when: float | None) -> None:
        """Move the deadline to clock time ``when``; None suspends it until the next call.

        As ``asyncio.Timeout.reschedule``: for a wait whose deadline follows what the
        block does (an engine's first output is due a while after each input it took,
        and not due while it waits for input). A no-op outside the block or once expired.
        """
        self.when = when
        if self._task is None or self._expired:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if when is not None:
            self._timer = self._clock.call_at(when, self._expire)

    async def __aenter__(self) -> Timeout:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout_at() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self.when is not None:
            self._timer = self._clock.call_at(self.when, self._expire)
        return self

    def _expire(self) -> None:
        task = self._task
        if task is not None and not task.done():
            self._expired = True
            task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if not self._expired or task is None:
            return
        # Our own cancel is consumed here; only then is the error a timeout.
        if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


def timeout_at(clock: Clock, when: float) -> Timeout:
    """``async with timeout_at(clock, when):`` fails the block at ``clock`` time ``when``."""
    return Timeout(clock, when)
