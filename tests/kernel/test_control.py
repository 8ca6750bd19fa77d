"""Control messages: the system lane for urgent user messages (Akka's ControlMessage).

A ``ControlMessage`` must overtake whatever is queued, never be refused for room, and
otherwise behave like any user message: ``receive`` handles it, an ask gets its reply,
a failure is supervised, and a restart stashes it ahead of the user messages.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from omni_actors import (
    Actor,
    ActorRef,
    ActorStoppedError,
    Backoff,
    ControlMessage,
    MailboxConfig,
    OverflowPolicy,
    Props,
    SupervisorStrategy,
)
from omni_actors.testing import ActorTestKit

NO_BACKOFF = SupervisorStrategy(backoff=Backoff(min_s=0.0, max_s=0.0, jitter=0.0))


@dataclass(frozen=True)
class Item:
    n: int


@dataclass(frozen=True)
class Hold:
    """Keeps the actor inside ``receive`` until ``release`` is set."""

    entered: asyncio.Event
    release: asyncio.Event


@dataclass(frozen=True)
class Dump:
    """Asks for everything handled so far."""


@dataclass(frozen=True)
class Urgent(ControlMessage):
    n: int


@dataclass(frozen=True)
class Crash(ControlMessage):
    """A control message whose handling fails."""


Msg = Item | Hold | Dump | Urgent | Crash


class Recorder(Actor[Msg]):
    """Logs what it handles into a list the test owns (so it survives restarts)."""

    def __init__(self, handled: list[object]) -> None:
        self.handled = handled

    async def receive(self, message: Msg) -> Any:
        match message:
            case Hold(entered, release):
                entered.set()
                await release.wait()
            case Dump():
                return list(self.handled)
            case Crash():
                raise ValueError("control failed")
            case Urgent(n):
                self.handled.append(message)
                return n * 10
            case _:
                self.handled.append(message)
        return None


async def hold(ref: ActorRef[Any]) -> asyncio.Event:
    """Park ``ref`` inside ``receive``; set the returned event to let it go on."""
    entered, release = asyncio.Event(), asyncio.Event()
    await ref.tell(Hold(entered, release))
    await entered.wait()
    return release


def test_control_message_mixes_into_structs_and_dataclasses() -> None:
    class Abort(msgspec.Struct, ControlMessage, tag=True, frozen=True):
        request_id: str

    abort = Abort("r1")
    assert isinstance(abort, ControlMessage)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(abort), type=Abort) == abort
    assert isinstance(Urgent(1), ControlMessage)
    assert ControlMessage.__slots__ == ()


async def test_control_message_overtakes_queued_user_messages() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, handled)
        release = await hold(ref)
        for i in range(5):
            await ref.tell(Item(i))
        await ref.tell(Urgent(1))
        await ref.tell(Urgent(2))
        release.set()
        assert await ref.ask(Dump()) == [Urgent(1), Urgent(2), *(Item(i) for i in range(5))]


@pytest.mark.parametrize("overflow", ["backpressure", "fail", "drop_oldest"])
async def test_control_message_is_accepted_by_a_full_mailbox(overflow: OverflowPolicy) -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(
            Recorder, handled, props=Props(mailbox=MailboxConfig(capacity=2, overflow=overflow))
        )
        release = await hold(ref)
        await ref.tell(Item(1))
        await ref.tell(Item(2))
        assert kit.mailbox_room(ref) == 0
        await ref.tell(Urgent(1), timeout=0.01)  # neither waits, raises nor drops
        answer = asyncio.ensure_future(ref.ask(Urgent(2), timeout=1))
        await kit.eventually(lambda: kit.mailbox_depth(ref, "system") == 2)
        release.set()
        assert await answer == 20
        assert await ref.ask(Dump()) == [Urgent(1), Urgent(2), Item(1), Item(2)]


async def test_ask_of_a_control_message_gets_the_reply_before_queued_work() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, handled, props=Props(mailbox=MailboxConfig(capacity=3)))
        release = await hold(ref)
        for i in range(3):
            await ref.tell(Item(i))
        answer = asyncio.ensure_future(ref.ask(Urgent(7)))
        await kit.eventually(lambda: kit.mailbox_depth(ref, "system") == 1)
        release.set()
        assert await answer == 70
        assert handled[0] == Urgent(7)  # answered before any queued item was handled


async def test_a_failing_control_message_is_supervised_like_any_message() -> None:
    handled: list[object] = []
    async with ActorTestKit(strategy=NO_BACKOFF) as kit:
        ref = await kit.spawn(Recorder, handled, props=Props(restart="permanent"))
        with pytest.raises(ValueError, match="control failed"):
            await ref.ask(Crash())
        assert await ref.ask(Urgent(3)) == 30  # restarted, same ref
        assert ref.is_alive


async def test_control_message_during_a_restart_is_replayed_before_stashed_messages(
    virtual_testkit: ActorTestKit,
) -> None:
    clock = virtual_testkit.virtual_clock
    handled: list[object] = []
    ref = await virtual_testkit.spawn(Recorder, handled, props=Props(restart="permanent"))
    with pytest.raises(ValueError, match="control failed"):
        await ref.ask(Crash())
    # the supervisor has scheduled the (virtual) backoff
    await virtual_testkit.eventually(clock.pending)
    await ref.tell(Item(1))
    await ref.tell(Item(2))
    await ref.tell(Urgent(1))
    answer = asyncio.ensure_future(ref.ask(Urgent(2)))
    # Nothing runs while the actor waits to restart (the advance below is what ends it).
    await virtual_testkit.consistently(lambda: not answer.done() and handled == [])
    clock.advance(10.0)
    assert await answer == 20
    assert await ref.ask(Dump()) == [Urgent(1), Urgent(2), Item(1), Item(2)]


async def test_ask_of_a_control_message_to_a_stopped_actor_raises() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, [])
        await kit.system.stop(ref)
        with pytest.raises(ActorStoppedError):
            await ref.ask(Urgent(1))
        with pytest.raises(ActorStoppedError):
            await ref.tell(Urgent(1))


async def test_a_control_ask_queued_when_the_actor_stops_fails_at_once() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, [])
        release = await hold(ref)
        stopping = asyncio.create_task(kit.system.stop(ref))
        # the Stop is queued in the system lane...
        await kit.eventually(lambda: kit.mailbox_depth(ref, "system") == 1)
        answer = asyncio.ensure_future(ref.ask(Urgent(1), timeout=30))
        # ...and the control message behind it
        await kit.eventually(lambda: kit.mailbox_depth(ref, "system") == 2)
        release.set()
        await stopping
        with pytest.raises(ActorStoppedError):
            await asyncio.wait_for(answer, 1)
