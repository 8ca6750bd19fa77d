"""Suite-wide checks: no test may leave an asyncio task behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio


@pytest_asyncio.fixture(autouse=True)
async def _no_stray_tasks() -> AsyncIterator[None]:
    yield
    current = asyncio.current_task()
    # Give tasks that were told to finish one loop turn to do so.
    for _ in range(3):
        stray = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not stray:
            return
        await asyncio.sleep(0)
    names = sorted(t.get_name() for t in stray)
    for task in stray:
        task.cancel()
    raise AssertionError(f"test left tasks running: {names}")
