"""A virtual clock: supervision time that moves only when a test says so."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

__all__ = ["VirtualClock"]


class _Timer:
    """A virtual timer; hashable by identity so owners can keep them in sets."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Implements ``omni_actors.Clock``; timers fire only inside :meth:`advance`.

    Pass it to ``ActorSystem(clock=...)`` (or use ``ActorTestKit(virtual_time=True)``) to
    test backoff and restart intensity exactly, with no sleeps.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        """Current virtual time in seconds."""
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        """Schedule ``callback`` at ``now() + delay`` virtual seconds."""
        timer = _Timer(self._now + max(0.0, delay), callback)
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
            self._now = timer.when
            timer.callback()
            fired += 1
        self._now = target
        return fired

    def pending(self) -> list[float]:
        """Delays (from now) of the timers still scheduled, soonest first."""
        return sorted(t.when - self._now for _, _, t in self._timers if not t.cancelled)
