"""A virtual clock: system time that moves only when a test says so."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["VirtualClock"]


class _Timer:
    """A virtual timer; hashable by identity so owners can keep them in sets."""

    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Implements ``omni_actors.Clock``; timers fire only inside :meth:`advance`.

    Pass it to ``ActorSystem(clock=...)`` (or use ``ActorTestKit(virtual_time=True)``) to
    test backoff, restart intensity and pipeline deadlines exactly, with no sleeps. Time
    in other processes (stages with ``process: true``) stays real.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        """Current virtual time in seconds."""
        return self._now

    def call_later(
        self, delay: float, callback: Callable[..., None], *args: Any
    ) -> _Timer | asyncio.Handle:
        """Schedule ``callback(*args)`` at ``now() + delay`` virtual seconds."""
        return self.call_at(self._now + max(0.0, delay), callback, *args)

    def call_at(
        self, when: float, callback: Callable[..., None], *args: Any
    ) -> _Timer | asyncio.Handle:
        """Schedule ``callback(*args)`` at virtual time ``when``.

        A time that has come already fires at once, on the running loop, as a loop's
        timer would: a deadline that virtual time passed before its wait began still
        expires. Without a running loop it fires in the next :meth:`advance`.
        """
        if when <= self._now:
            try:
                return asyncio.get_running_loop().call_soon(callback, *args)
            except RuntimeError:
                pass
        timer = _Timer(when, callback, args)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    def advance(self, seconds: float) -> int:
        """Move time forward, running due callbacks in deadline order; returns how many ran."""
        if seconds < 0:
            raise ValueError("virtual time cannot go backwards")
        target = self._now + seconds
        fired = 0
        while self._timers and self._timers[0][0] <= target:
            timer = heapq.heappop(self._timers)[2]
            if timer.cancelled:
                continue
            self._now = max(self._now, timer.when)
            timer.callback(*timer.args)
            fired += 1
        self._now = target
        return fired

    def pending(self) -> list[float]:
        """Delays (from now) of the timers still scheduled, soonest first."""
        return sorted(t.when - self._now for _, _, t in self._timers if not t.cancelled)
