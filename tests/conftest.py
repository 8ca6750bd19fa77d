"""Suite-wide checks: no test may leave an asyncio task or a child process behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
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


def _children(pid: int) -> list[int]:
    """Live (or unreaped) child processes of ``pid``, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True)
def _no_orphan_processes() -> Iterator[None]:
    before = set(_children(os.getpid()))
    yield
    leaked = set(_children(os.getpid())) - before
    names = {pid: _cmdline(pid) for pid in leaked}
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not leaked, f"test left child processes running: {names}"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"
