"""Refs inside messages: workers address each other and the parent directly."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from remote_actors import Count, Echo, Forwarder, Greeter, Notify, Payload, Pid, Route

from omni_actors import ActorStoppedError, Props
from omni_actors.testing import ActorTestKit, eventually


async def _routed_reaches(ref: object, routed: int) -> None:
    """Wait until ``ref`` (an ``Echo``) has handled ``routed`` messages besides our asks.

    Its count includes each ``Count`` ask, so the asks are subtracted: counting them as
    routed messages would let the wait end before anything was routed.
    """
    asks = 0

    async def routed_so_far() -> bool:
        nonlocal asks
        asks += 1
        n: int = await ref.ask(Count(), timeout=10)  # type: ignore[attr-defined]
        return n - asks >= routed

    await eventually(routed_so_far, what=f"{routed} messages routed")


async def test_a_worker_sends_to_another_worker_by_ref() -> None:
    async with ActorTestKit() as kit:
        forwarder = await kit.spawn(Forwarder, name="forwarder", props=Props(process=True))
        echo = await kit.spawn(Echo, name="echo", props=Props(process=True))
        data = torch.arange(1 << 19, dtype=torch.float32)  # 2 MiB: a slab between workers
        await forwarder.tell(Route(echo, Payload(1, data)))
        await forwarder.tell(Route(echo, Payload(2, data[:10])))
        await _routed_reaches(echo, 2)


async def test_a_worker_replies_to_a_ref_in_the_parent() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        greeter = await kit.spawn(Greeter, name="greeter", props=Props(process=True))
        pid = await greeter.ask(Pid(), timeout=10)
        await greeter.tell(Notify(probe.ref))
        assert await probe.expect_message(f"hello from {pid}", timeout=10)


async def test_refs_to_a_dead_worker_fail_instead_of_hanging() -> None:
    async with ActorTestKit() as kit:
        forwarder = await kit.spawn(Forwarder, name="forwarder", props=Props(process=True))
        echo = await kit.spawn(Echo, name="echo", props=Props(process=True))
        await forwarder.tell(Route(echo, Payload(1, torch.ones(2))))
        await _routed_reaches(echo, 1)
        probe = await kit.create_probe()
        probe.watch(forwarder)
        echo_pid = await echo.ask(Pid(), timeout=10)
        os.kill(echo_pid, signal.SIGKILL)
        await probe.expect_no_message(0.3)
        # The forwarder's next send to the dead worker raises: it fails, and as a
        # temporary actor it stops (its watcher sees why).
        with pytest.raises(ActorStoppedError):
            await echo.tell(Count())
        await forwarder.tell(Route(echo, Payload(2, torch.ones(2))))
        terminated = await probe.expect_terminated(forwarder, timeout=10)
        assert terminated.reason is not None
