"""Time source used by supervision (backoff timers and restart intensity windows).

The runtime never calls ``time`` or ``loop.call_later`` directly for supervision, so
tests can swap in :class:`omni_actors.testing.VirtualClock` and drive backoff and
intensity deterministically instead of sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "LoopClock", "TimerHandle"]


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled."""

    def cancel(self) -> None:
        """Prevent the callback from running; a no-op once it has run."""


class Clock(Protocol):
    """Monotonic time plus one-shot timers."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` (synchronously, on the event loop) after ``delay`` seconds."""


class LoopClock:
    """The running event loop's clock: the production default."""

    def now(self) -> float:
        """Return the event loop's monotonic time."""
        return asyncio.get_running_loop().time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Schedule ``callback`` on the running loop."""
        return asyncio.get_running_loop().call_later(max(0.0, delay), callback)
