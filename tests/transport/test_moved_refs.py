"""A ref to a process actor, held in another worker, follows the actor to its next worker.

Worker A got a ref to process actor B inside a message. When B's worker dies and B's
supervisor restarts it elsewhere, A's ref reaches the new instance; sends made while B
restarts wait for it; if B is not coming back, they fail promptly.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ref_holders import AskPid, Holder, Keep, SendNote, Tally
from remote_actors import History

from omni_actors import ActorRef, Backoff, Props, SupervisorStrategy, remoting
from omni_actors.testing import ActorTestKit, kill_worker, worker_pid

FAST_RESTART = SupervisorStrategy(backoff=Backoff(min_s=0.0, max_s=0.0, jitter=0.0))
# Long enough that a test can act while the actor is down, and short for a test.
SLOW_RESTART = SupervisorStrategy(backoff=Backoff(min_s=1.5, max_s=1.5, jitter=0.0))
PERMANENT = Props(process=True, restart="permanent")


async def _spawn_pair(kit: ActorTestKit) -> tuple[ActorRef[Any], ActorRef[Any], int]:
    """B (a ``Tally``) and A (a ``Holder`` in another worker keeping B's ref)."""
    tally = await kit.spawn(Tally, name="tally", props=PERMANENT)
    holder = await kit.spawn(Holder, name="holder", props=Props(process=True))
    assert await holder.ask(Keep(tally), timeout=10) == "kept"
    pid = await holder.ask(AskPid(), timeout=30)
    assert pid == worker_pid(tally)
    return tally, holder, pid


async def _down(kit: ActorTestKit, ref: ActorRef[Any]) -> None:
    """Wait until the parent has seen ``ref``'s worker die, and so told the others."""
    mailbox: Any = remoting.mailbox_of(ref)
    await kit.eventually(lambda: mailbox.link is None, what="the worker's death noticed")


async def _restarted(kit: ActorTestKit, ref: ActorRef[Any], old_pid: int) -> int:
    """Wait until ``ref`` runs in a new worker (announced to the others by then)."""

    def new_pid() -> int:
        try:
            pid = worker_pid(ref)
        except ValueError:
            return 0  # between workers
        return 0 if pid == old_pid else pid

    return await kit.eventually(new_pid, timeout=60, what="restarted in a new worker")


async def test_a_ref_held_by_another_worker_reaches_the_restarted_actor() -> None:
    async with ActorTestKit(strategy=FAST_RESTART) as kit:
        tally, holder, first = await _spawn_pair(kit)
        kill_worker(tally)
        second = await _restarted(kit, tally, first)
        # The same ref the holder got before: it now names the new worker.
        assert await holder.ask(AskPid(), timeout=30) == second
        assert await holder.ask(SendNote(1), timeout=30) == "sent"
        assert await tally.ask(History(), timeout=10) == [1]
        # And again, after a second move.
        kill_worker(tally)
        third = await _restarted(kit, tally, second)
        assert await holder.ask(SendNote(2), timeout=30) == "sent"
        assert await tally.ask(History(), timeout=10) == [2]
        assert await holder.ask(AskPid(), timeout=30) == third


async def test_sends_while_the_actor_restarts_wait_and_reach_it() -> None:
    async with ActorTestKit(strategy=SLOW_RESTART) as kit:
        tally, holder, first = await _spawn_pair(kit)
        kill_worker(tally)
        await _down(kit, tally)
        # Sent after the holder's worker heard of the death (the parent told it first,
        # on the same link), while the supervisor waits out its backoff.
        note = asyncio.ensure_future(holder.ask(SendNote(7), timeout=60))
        pid = asyncio.ensure_future(holder.ask(AskPid(), timeout=60))
        await kit.consistently(lambda: not note.done(), 0.3, what="the send waits")
        second = await _restarted(kit, tally, first)
        assert await note == "sent"
        assert await pid == second
        assert await tally.ask(History(), timeout=10) == [7]


async def test_a_ref_to_an_actor_stopped_for_good_fails_at_once() -> None:
    async with ActorTestKit(strategy=FAST_RESTART) as kit:
        tally, holder, _ = await _spawn_pair(kit)
        await kit.system.stop(tally)
        # Promptly: a held send would wait out its 60 s timeout, past this ask's.
        assert await holder.ask(SendNote(1), timeout=20) == "ActorStoppedError"
        assert await holder.ask(AskPid(), timeout=20) == "ActorStoppedError"


async def test_a_temporary_actor_killed_fails_its_refs_at_once() -> None:
    async with ActorTestKit() as kit:
        tally = await kit.spawn(Tally, name="tally", props=Props(process=True))
        holder = await kit.spawn(Holder, name="holder", props=Props(process=True))
        await holder.ask(Keep(tally), timeout=10)
        assert await holder.ask(AskPid(), timeout=30) == worker_pid(tally)
        probe = await kit.create_probe()
        probe.watch(tally)
        kill_worker(tally)
        await probe.expect_terminated(tally, timeout=10)
        assert await holder.ask(SendNote(1), timeout=20) == "ActorStoppedError"


async def test_senders_waiting_for_a_restart_fail_when_the_actor_is_stopped() -> None:
    async with ActorTestKit(strategy=SLOW_RESTART) as kit:
        tally, holder, _ = await _spawn_pair(kit)
        kill_worker(tally)
        await _down(kit, tally)
        note = asyncio.ensure_future(holder.ask(SendNote(1), timeout=20))
        # The holder's send waits for the restart; the actor is stopped instead.
        await kit.consistently(lambda: not note.done(), 0.3, what="the send waits")
        await kit.system.stop(tally)
        assert await note == "ActorStoppedError"
