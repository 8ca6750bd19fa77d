"""Supervision decisions a parent makes about its children (OTP semantics).

A ``Supervisor`` belongs to one cell but runs in a task of its own, beside the cell's
message loop: a parent that is busy in ``receive`` — typically awaiting an ask to the
very child that just failed — must still be able to restart that child, or the two
would wait on each other. Supervisor work is serialised in that one task, so its
bookkeeping needs no locks. Restarts are two-phase, as in OTP: the affected children are
torn down in reverse start order, then started again in start order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from omni_actors import _system_messages as sm
from omni_actors.clock import TimerHandle
from omni_actors.errors import RestartIntensityExceededError
from omni_actors.supervision import SupervisorStrategy

if TYPE_CHECKING:
    from omni_actors._cell import ActorCell

__all__ = ["Supervisor"]

log = logging.getLogger("omni_actors")


class Supervisor:
    """Restart intensity, backoff timers and restart groups of one parent cell."""

    def __init__(self, cell: ActorCell, strategy: SupervisorStrategy) -> None:
        self.cell = cell
        self.strategy = strategy
        self._restarts: deque[float] = deque()
        self._child_restarts: dict[ActorCell, deque[float]] = {}
        self._pending: set[ActorCell] = set()
        self._timers: set[TimerHandle] = set()
        self._inbox: deque[sm.ChildExited | sm.RestartGroup] = deque()
        self._task: asyncio.Task[None] | None = None

    def post(self, message: sm.ChildExited | sm.RestartGroup) -> None:
        """Queue supervisor work; runs in this supervisor's task, not the cell's loop."""
        cell = self.cell
        if cell.state.ending:
            if isinstance(message, sm.ChildExited):
                message.child.mailbox.push_system(sm.Stop(message.error))
            return
        self._inbox.append(message)
        if self._task is None or self._task.done():
            self._task = cell.system._create_task(self._run(), name=f"supervisor {cell.path}")

    async def _run(self) -> None:
        while self._inbox:
            match self._inbox.popleft():
                case sm.ChildExited(child=child, error=error):
                    await self.child_exited(child, error)
                case sm.RestartGroup(children=children, cause=cause):
                    await self.restart_group(children, cause)

    async def close(self) -> None:
        """Stop supervising (the cell is stopping or being restarted) and reset."""
        self.abort()
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            await asyncio.gather(task, return_exceptions=True)
        self._restarts.clear()
        self._child_restarts.clear()
        self._pending.clear()

    def abort(self) -> None:
        """Cancel timers, queued work and the running task without waiting."""
        self.cancel_timers()
        self._inbox.clear()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    def forget(self, child: ActorCell) -> None:
        """Drop bookkeeping for a child that has stopped for good."""
        self._pending.discard(child)
        self._child_restarts.pop(child, None)

    def cancel_timers(self) -> None:
        """Cancel scheduled restarts (the parent is stopping)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    async def child_exited(self, child: ActorCell, error: BaseException | None) -> None:
        """Apply the strategy to a child that exited (failed, or a permanent child that
        stopped itself); may escalate by failing the parent."""
        cell = self.cell
        if cell.children.get(child.name) is not child or child in self._pending:
            return  # already stopped, or already part of a scheduled restart
        strategy = self.strategy
        now = cell.system.clock.now()
        if _count(self._restarts, now, strategy.period) > strategy.max_restarts:
            await self._escalate(child, error)
            return
        attempt = _count(self._child_restarts.setdefault(child, deque()), now, strategy.period)
        group = self._group(child)
        restart: list[ActorCell] = []
        for member in group:
            if member is child or member.restart != "temporary":
                restart.append(member)
                if member is not child:
                    member.mailbox.push_system(sm.Suspend())
            else:
                # OTP: a temporary sibling is shut down, not restarted.
                member.mailbox.push_system(sm.Stop())
        self._pending.update(restart)
        delay = strategy.backoff.delay(attempt, cell.system.rng)
        log.info("restarting %s in %.3fs after %r", [m.path for m in restart], delay, error)
        if delay <= 0:
            await self.restart_group(restart, error)
            return
        timer: TimerHandle | None = None

        def fire() -> None:
            if timer is not None:
                self._timers.discard(timer)
            self.post(sm.RestartGroup(restart, error))

        timer = cell.system.clock.call_later(delay, fire)
        self._timers.add(timer)

    def _group(self, child: ActorCell) -> list[ActorCell]:
        children = list(self.cell.children.values())
        match self.strategy.strategy:
            case "one_for_all":
                return children
            case "rest_for_one":
                return children[children.index(child) :]
            case _:
                return [child]

    async def restart_group(self, group: list[ActorCell], cause: BaseException | None) -> None:
        """Tear the group down in reverse start order, then start it in start order."""
        cell = self.cell
        for phase in ("teardown", "restart"):
            members = group if phase == "restart" else list(reversed(group))
            for member in members:
                if cell.children.get(member.name) is not member:
                    continue
                if phase == "restart":
                    self._pending.discard(member)
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                message = sm.Teardown(done) if phase == "teardown" else sm.Restart(cause, done)
                if member.mailbox.push_system(message):
                    await self._await_member(member, done)

    async def _await_member(self, member: ActorCell, done: asyncio.Future[None]) -> None:
        timeout = self.strategy.restart_timeout
        waiters: list[asyncio.Future[Any]] = [done, member.terminated]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            log.error("%s did not restart within %gs; killing it", member.path, timeout)
            member.kill()

    async def _escalate(self, child: ActorCell, error: BaseException | None) -> None:
        cell = self.cell
        strategy = self.strategy
        exc = RestartIntensityExceededError(
            cell.path, child.path, strategy.max_restarts, strategy.period
        )
        exc.__cause__ = error
        log.error("%s", exc)
        self.cancel_timers()
        self._pending.clear()
        self._restarts.clear()
        # Recorded before the children stop: a message the cell is handling may fail
        # because of that, and must not mask the real reason.
        cell.escalation = exc
        await cell.stop_children()
        # The cell's own loop turns this into its failure (after any current message).
        cell.mailbox.push_system(sm.Fail(exc))


def _count(window: deque[float], now: float, period: float) -> int:
    """Record a restart at ``now`` and return how many fall within ``period``.

    The window is closed at both ends, as OTP's (``supervisor:add_restart/3`` keeps the
    restarts ``R >= Now - Period``): a restart exactly ``period`` ago still counts; only
    older ones are dropped.
    """
    window.append(now)
    while window and window[0] < now - period:
        window.popleft()
    return len(window)
