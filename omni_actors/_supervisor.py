"""Supervision decisions a parent makes about its children (OTP semantics).

A ``Supervisor`` belongs to one cell and runs only inside that cell's task, so its
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
    from omni_actors._cell import ActorCell, _Exit

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

    def forget(self, child: ActorCell) -> None:
        """Drop bookkeeping for a child that has stopped for good."""
        self._pending.discard(child)
        self._child_restarts.pop(child, None)

    def cancel_timers(self) -> None:
        """Cancel scheduled restarts (the parent is stopping)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    async def child_failed(self, child: ActorCell, error: BaseException | None) -> _Exit | None:
        """Apply the strategy to a failed child; may escalate by failing the parent."""
        cell = self.cell
        if cell.children.get(child.name) is not child or child in self._pending:
            return None  # already stopped, or already part of a scheduled restart
        strategy = self.strategy
        now = cell.system.clock.now()
        if _count(self._restarts, now, strategy.period) > strategy.max_restarts:
            return await self._escalate(child, error)
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
            cell.mailbox.push_system(sm.RestartGroup(restart, error))
            return None
        timer: TimerHandle | None = None

        def fire() -> None:
            if timer is not None:
                self._timers.discard(timer)
            cell.mailbox.push_system(sm.RestartGroup(restart, error))

        timer = cell.system.clock.call_later(delay, fire)
        self._timers.add(timer)
        return None

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

    async def _escalate(self, child: ActorCell, error: BaseException | None) -> _Exit | None:
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
        await cell.stop_children()
        cell.state = "suspended"
        return cell._fail(exc)


def _count(window: deque[float], now: float, period: float) -> int:
    """Record a restart at ``now`` and return how many fall within ``period``."""
    window.append(now)
    while window and window[0] <= now - period:
        window.popleft()
    return len(window)
