"""Actors in worker processes: same ref API, death detection, flow control, cleanup."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys

import pytest
import torch
from remote_actors import Block, Count, Crash, Echo, FailsToStart, Payload, Pid

from omni_actors import (
    ActorStoppedError,
    AskTimeoutError,
    Backoff,
    MailboxConfig,
    MailboxFullError,
    MessageTypeError,
    Props,
    ProtocolVersionError,
    SendTimeoutError,
    SupervisorStrategy,
    WorkerDiedError,
)
from omni_actors.protocols import wire
from omni_actors.testing import ActorTestKit, eventually
from omni_actors.transport.process_placement import ProcessPlacement
from omni_actors.transport.worker_main import WIRE_VERSION_ENV

FAST_RESTART = SupervisorStrategy(backoff=Backoff(min_s=0.0, max_s=0.0, jitter=0.0))


def _shm_of(pids: list[int]) -> set[str]:
    prefixes = tuple(f"omni-actors-{pid}-" for pid in pids)
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefixes)}


async def test_tell_and_ask_round_trip_with_tensors() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Echo, 2.0, name="echo", props=Props(process=True))
        assert ref.path == "/echo"
        small = torch.arange(8, dtype=torch.float32)
        reply = await ref.ask(Payload(1, small), timeout=10)
        assert isinstance(reply, Payload)
        assert torch.equal(reply.data, small * 2)
        big = torch.randn(1 << 19)  # 2 MiB: goes through the shared-memory slab
        reply = await ref.ask(Payload(2, big), timeout=10)
        assert torch.allclose(reply.data, big * 2)
        await ref.tell(Payload(3, small))
        assert await ref.ask(Count(), timeout=10) == 4
        assert await ref.ask(Pid(), timeout=10) != os.getpid()


async def test_wrong_type_is_rejected_before_the_wire() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Echo, name="echo", props=Props(process=True))
        with pytest.raises(MessageTypeError, match="does not accept str"):
            await ref.tell("hello")  # type: ignore[arg-type]


async def test_remote_error_reaches_the_asker_with_its_type() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(
            Echo, name="echo", props=Props(process=True, restart="permanent", strategy=FAST_RESTART)
        )
        with pytest.raises(ValueError, match="bad chunk"):
            await ref.ask(Crash("bad chunk"), timeout=10)


async def test_failed_on_start_in_worker_fails_spawn() -> None:
    async with ActorTestKit() as kit:
        with pytest.raises(RuntimeError, match="no model weights"):
            await kit.spawn(FailsToStart, name="broken", props=Props(process=True))
        assert not kit.is_alive("/broken")


async def test_sigkill_fails_pending_asks_and_restarts_permanent_actor() -> None:
    async with ActorTestKit(strategy=FAST_RESTART) as kit:
        probe = await kit.create_probe()
        ref = await kit.spawn(Echo, name="echo", props=Props(process=True, restart="permanent"))
        first_pid = await ref.ask(Pid(), timeout=10)
        credits = kit.mailbox_room(ref)
        blocked = asyncio.ensure_future(ref.ask(Block(30), timeout=30))
        # The Block has been sent (it took a credit): the worker holds the ask.
        await kit.eventually(lambda: kit.mailbox_room(ref) < credits)
        os.kill(first_pid, signal.SIGKILL)
        with pytest.raises((WorkerDiedError, ActorStoppedError)):
            await asyncio.wait_for(blocked, 10)
        probe.watch(ref)
        # The supervisor restarts it in a fresh worker; the same ref works again.
        second_pid = await ref.ask(Pid(), timeout=30)
        assert second_pid != first_pid
        await probe.expect_no_message(0.05)  # a restart is not a termination
        x = torch.ones(4)
        assert torch.equal((await ref.ask(Payload(1, x), timeout=10)).data, x)


async def test_sigkill_stops_temporary_actor_and_notifies_watchers() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        ref = await kit.spawn(Echo, name="echo", props=Props(process=True))
        pid = await ref.ask(Pid(), timeout=10)
        probe.watch(ref)
        os.kill(pid, signal.SIGKILL)
        terminated = await probe.expect_terminated(ref, timeout=10)
        assert isinstance(terminated.reason, WorkerDiedError)
        assert "signal 9" in str(terminated.reason)
        with pytest.raises(ActorStoppedError):
            await ref.tell(Count())


async def test_credit_flow_control_bounds_the_sender() -> None:
    async with ActorTestKit(stop_timeout=1.0) as kit:
        ref = await kit.spawn(
            Echo, name="echo", props=Props(process=True, mailbox=MailboxConfig(capacity=4))
        )
        await ref.tell(Block(30))  # occupies the actor; its credit is not returned
        for _ in range(3):
            await ref.tell(Count(), timeout=5)
        with pytest.raises(SendTimeoutError):
            await ref.tell(Count(), timeout=0.3)


async def test_no_process_socket_or_segment_left_after_shutdown() -> None:
    async with ActorTestKit() as kit:
        a = await kit.spawn(Echo, name="a", props=Props(process=True))
        b = await kit.spawn(Echo, name="b", props=Props(process=True))
        pids = [await a.ask(Pid(), timeout=10), await b.ask(Pid(), timeout=10)]
        placement = kit.system._placements["process"]
        assert isinstance(placement, ProcessPlacement)
        rundir = placement.workers.rundir.path
        assert stat.S_IMODE(os.stat(rundir).st_mode) == 0o700
        await a.ask(Payload(0, torch.zeros(1 << 19)), timeout=10)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not os.path.exists(rundir)
    assert not _shm_of([os.getpid(), *pids])


PARENT = """
import asyncio, os, sys, time
sys.path.insert(0, {here!r})
from remote_actors import Echo, Pid
from omni_actors import ActorSystem, Props

async def main():
    system = ActorSystem()
    await system.start()
    ref = await system.spawn(Echo, name="echo", props=Props(process=True))
    print(await ref.ask(Pid(), timeout=30), flush=True)
    await asyncio.sleep(60)  # alive until the test kills it: the behaviour under test

asyncio.run(main())
"""


async def test_workers_exit_when_their_parent_is_killed() -> None:
    here = os.path.dirname(__file__)
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PARENT.format(here=here), stdout=asyncio.subprocess.PIPE
    )
    assert parent.stdout is not None
    worker_pid = int(await asyncio.wait_for(parent.stdout.readline(), 60))
    parent.kill()
    await parent.wait()

    def worker_gone() -> bool:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:  # the worker sees stdin close and exits on its own
        await eventually(worker_gone, what="the worker exits after its parent")
    except AssertionError:
        os.kill(worker_pid, signal.SIGKILL)
        raise


async def test_remote_fail_policy_and_ask_deadline() -> None:
    async with ActorTestKit(stop_timeout=1.0) as kit:
        ref = await kit.spawn(
            Echo,
            name="echo",
            props=Props(process=True, mailbox=MailboxConfig(capacity=2, overflow="fail")),
        )
        with pytest.raises(AskTimeoutError):
            await ref.ask(Block(30), timeout=0.2)  # the deadline fires; the actor is busy
        await ref.tell(Count())
        with pytest.raises(MailboxFullError):
            await ref.tell(Count())


async def test_a_worker_of_another_wire_version_is_refused_at_the_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The worker announces another version through the real launch path.
    monkeypatch.setenv(WIRE_VERSION_ENV, str(wire.VERSION + 1))
    async with ActorTestKit() as kit:
        with pytest.raises(ProtocolVersionError) as refused:
            await kit.spawn(Echo, name="echo", props=Props(process=True))
        assert (refused.value.ours, refused.value.theirs) == (wire.VERSION, wire.VERSION + 1)
        assert f"version {wire.VERSION + 1}" in str(refused.value)
        assert f"version {wire.VERSION}:" in str(refused.value)
