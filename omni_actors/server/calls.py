"""``Calls``: the WebRTC calls a server holds, each owned until it ends.

A call outlives the ``POST /v1/realtime/calls`` that answered it, so its task belongs to
the server, here: a hang-up (``POST /v1/realtime/calls/{id}/hangup``) cancels one, and
the server's shutdown cancels those left and waits for them, so no peer connection or
task outlives the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["Calls"]

log = logging.getLogger(__name__)

_HANG_UP_S = 10.0  # a call's close (its session's, its peer connection's) takes this at most


class Calls:
    """The live calls of one server, by id."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, call_id: str, run: Coroutine[Any, Any, None]) -> None:
        """Run a call (``run`` closes everything of it, whatever ends it)."""
        # A task cancelled before its first step never enters ``run``'s ``finally``; none
        # is: a hang-up or a shutdown reaches this task only in a later turn of the loop,
        # after its first step (tasks start in the order they were made).
        task = asyncio.create_task(run, name=f"call {call_id}")
        self._tasks[call_id] = task
        task.add_done_callback(lambda done: self._ended(call_id, done))

    def _ended(self, call_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(call_id) is task:
            del self._tasks[call_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("call %s failed", call_id, exc_info=task.exception())

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    async def hang_up(self, call_id: str) -> bool:
        """End a call and wait until it is closed; False if no such call is live."""
        task = self._tasks.get(call_id)
        if task is None:
            return False
        await _end((task,))
        return True

    async def close(self) -> None:
        """End every call and wait until each is closed (the server is stopping)."""
        await _end(tuple(self._tasks.values()))


async def _end(tasks: tuple[asyncio.Task[None], ...]) -> None:
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    _, late = await asyncio.wait(tasks, timeout=_HANG_UP_S)
    for task in late:
        log.error("%s did not end within %gs of its cancel", task.get_name(), _HANG_UP_S)
