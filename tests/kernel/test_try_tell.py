"""``ActorRef.try_tell``: a send that needs no wait goes out at once; one that would
wait sends nothing and says so, so the caller awaits ``tell`` in turn."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from omni_actors import (
    Actor,
    ActorStoppedError,
    ControlMessage,
    MailboxConfig,
    MessageTypeError,
    Props,
    remoting,
)
from omni_actors.testing import ActorTestKit


@dataclass(frozen=True)
class Item:
    n: int


@dataclass(frozen=True)
class Urgent(ControlMessage):
    n: int


@dataclass(frozen=True)
class Hold:
    entered: asyncio.Event
    release: asyncio.Event


class Slow(Actor[Item | Urgent | Hold]):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def receive(self, message: Item | Urgent | Hold) -> None:
        match message:
            case Item(n=n):
                self.log.append(f"item {n}")
            case Urgent(n=n):
                self.log.append(f"urgent {n}")
            case Hold(entered=entered, release=release):
                entered.set()
                await release.wait()


async def test_a_full_mailbox_sends_nothing_and_tell_then_waits_for_room() -> None:
    log: list[str] = []
    async with ActorTestKit() as kit:
        props = Props(mailbox=MailboxConfig(capacity=2))
        ref = await kit.spawn(Slow, log, props=props)
        entered, release = asyncio.Event(), asyncio.Event()
        assert ref.try_tell(Hold(entered, release))
        await entered.wait()
        assert ref.try_tell(Item(1))
        assert ref.try_tell(Item(2))
        assert not ref.try_tell(Item(3))  # full: nothing queued
        assert ref.try_tell(Urgent(4))  # control messages never wait
        waiting = asyncio.ensure_future(ref.tell(Item(3)))
        mailbox = remoting.mailbox_of(ref)
        await kit.eventually(lambda: mailbox.waiting_senders == 1, what="tell waiting")
        assert not waiting.done()
        release.set()
        await waiting
        await kit.eventually(lambda: len(log) == 4, what="every message handled")
        assert log == ["urgent 4", "item 1", "item 2", "item 3"]


async def test_try_tell_checks_types_and_a_stopped_actor_as_tell_does() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Slow, [])
        with pytest.raises(MessageTypeError):
            ref.try_tell("not an item")  # type: ignore[arg-type]
        await kit.system.stop(ref)
        with pytest.raises(ActorStoppedError):
            ref.try_tell(Item(1))
