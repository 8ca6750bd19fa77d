"""Waiting on conditions in tests: :func:`eventually` and :func:`consistently`.

A test never sleeps to let something happen: it waits until a condition that proves it
holds (:func:`eventually`), under a deadline that only matters when the code is broken.
Showing that something does *not* happen needs a window of time; :func:`consistently`
is that window, small and bounded, checking the condition throughout instead of
sleeping blind.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["consistently", "eventually"]

T = TypeVar("T")

_POLL_S = 0.002  # first pause between checks; doubles up to _POLL_MAX_S
_POLL_MAX_S = 0.05

Condition = Callable[[], "T | Awaitable[T]"]


async def _check(condition: Condition[T]) -> T:
    value = condition()
    if inspect.isawaitable(value):
        return await value
    return value


async def eventually(condition: Condition[T], timeout: float = 5.0, what: str = "") -> T:
    """Wait until ``condition()`` holds, and return what it returned.

    ``condition`` is a plain or an async callable. It says "not yet" by returning a
    falsy value (``False``, ``0``, an empty list) or by raising ``AssertionError``; an
    assertion-style check (``assert`` statements, returning ``None``) holds once it returns
    without raising. If the deadline passes, the failure names the last value or
    assertion, so it says what was wrong.

    Args:
        condition: what must become true.
        timeout: real seconds before the test fails; generous, since a passing test
            never waits that long.
        what: words for the failure message.

    Raises:
        AssertionError: the condition did not hold within ``timeout``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = _POLL_S
    while True:
        failure: AssertionError | None = None
        try:
            value = await _check(condition)
        except AssertionError as exc:
            failure = exc
        else:
            if value or value is None:
                return value
        if loop.time() >= deadline:
            label = what or getattr(condition, "__name__", repr(condition))
            if failure is not None:
                raise AssertionError(f"not true within {timeout:g}s: {label}: {failure}")
            raise AssertionError(f"not true within {timeout:g}s: {label} (last: {value!r})")
        # Polling is the point of this helper: the one sleep a test may rely on.
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        pause = min(pause * 2, _POLL_MAX_S)


async def consistently(condition: Condition[object], duration: float = 0.1, what: str = "") -> None:
    """Assert that ``condition()`` stays truthy for ``duration`` real seconds.

    The one way a test shows that something does *not* happen (no message, no restart)
    when no event marks its absence: it is checked throughout the window, and the
    window is small and bounded. Prefer a positive condition that proves progress, or
    ``TestProbe.expect_no_message``, where one exists.

    Raises:
        AssertionError: the condition was false at some check (or raised one).
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    while True:
        if not await _check(condition):
            label = what or getattr(condition, "__name__", repr(condition))
            raise AssertionError(f"stopped being true within {duration:g}s: {label}")
        remaining = end - loop.time()
        if remaining <= 0:
            return
        await asyncio.sleep(min(_POLL_MAX_S, remaining))
