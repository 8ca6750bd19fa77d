"""Control messages and ``ChildFailed`` with actors in worker processes."""

from __future__ import annotations

import asyncio
import os
import signal

from remote_actors import Block, Echo, History, Note, Pid, Recorder, Urgent

from omni_actors import (
    Actor,
    ActorRef,
    ChildFailed,
    MailboxConfig,
    Props,
    Terminated,
    WorkerDiedError,
)
from omni_actors.testing import ActorTestKit


async def test_control_message_overtakes_a_full_process_mailbox_without_a_credit() -> None:
    async with ActorTestKit(stop_timeout=1.0) as kit:
        ref = await kit.spawn(
            Recorder, name="rec", props=Props(process=True, mailbox=MailboxConfig(capacity=4))
        )
        await ref.tell(Block(0.5))  # keeps the actor busy; its credit is not returned
        for n in (1, 2, 3):
            await ref.tell(Note(n), timeout=5)
        assert kit.mailbox_room(ref) == 0  # no credit left
        blocked = asyncio.ensure_future(ref.tell(Note(4), timeout=10))
        await kit.eventually(lambda: kit.blocked_senders(ref) == 1)
        assert not blocked.done()  # out of credits: a user message waits
        # The control message goes at once, takes no credit and is handled first.
        assert await ref.ask(Urgent(1), timeout=5) == 10
        await blocked
        assert await ref.ask(History(), timeout=5) == [-1, 1, 2, 3, 4]
        # Every credit came back, and none extra for the control message.
        await kit.eventually(lambda: kit.mailbox_room(ref) == 4)
        await kit.consistently(lambda: kit.mailbox_room(ref) == 4)
        for n in range(5, 15):
            await ref.tell(Note(n), timeout=5)
        assert await ref.ask(History(), timeout=5) == [-1, *range(1, 15)]


class Parent(Actor[ChildFailed | Terminated]):
    """Spawns a temporary process child, watches it, forwards signals to ``sink``."""

    def __init__(self, sink: ActorRef[object]) -> None:
        self.sink = sink

    async def on_start(self) -> None:
        child = await self.context.spawn(Echo, name="echo", props=Props(process=True))
        self.context.watch(child)

    async def receive(self, message: ChildFailed | Terminated) -> None:
        await self.sink.tell(message)


async def test_parent_hears_that_its_process_child_was_killed() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        await kit.spawn(Parent, probe.ref, name="p")
        child = kit.system.lookup("p/echo")
        os.kill(await child.ask(Pid(), timeout=10), signal.SIGKILL)
        failed = await probe.expect_message(ChildFailed, timeout=10)
        assert failed.ref == child
        assert isinstance(failed.reason, WorkerDiedError)
        assert "signal 9" in str(failed.reason)
        assert await probe.expect_message(Terminated, timeout=10) == Terminated(
            child, failed.reason
        )
        await probe.expect_no_message(0.05)
