"""The mailbox: the system lane goes first, overflow policies, FIFO order, fair waiting."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from omni_actors import (
    Actor,
    ActorRef,
    ActorStoppedError,
    MailboxConfig,
    MailboxFullError,
    MessageDroppedError,
    OmniError,
    Props,
    SendTimeoutError,
    Terminated,
)
from omni_actors._mailbox import Mailbox
from omni_actors.testing import ActorTestKit, eventually


@dataclass
class Item:
    n: int


@dataclass
class Hold:
    """Keeps the actor inside ``receive`` until ``release`` is set."""

    entered: asyncio.Event
    release: asyncio.Event


@dataclass
class Dump:
    """Asks for everything handled so far."""


class Recorder(Actor[Item | Hold | Dump | Terminated]):
    """Logs every message it handles into a list the test owns."""

    def __init__(
        self,
        handled: list[object],
        watch: ActorRef[Any] | None = None,
        forward: ActorRef[object] | None = None,
    ) -> None:
        self.handled = handled
        self.watch = watch
        self.forward = forward

    async def on_start(self) -> None:
        if self.watch is not None:
            self.context.watch(self.watch)

    async def receive(self, message: Item | Hold | Dump | Terminated) -> Any:
        match message:
            case Hold(entered, release):
                entered.set()
                await release.wait()
            case Dump():
                return list(self.handled)
            case _:
                self.handled.append(message)
                if self.forward is not None:
                    await self.forward.tell(message)
        return None


class Idle(Actor[Item]):
    async def receive(self, message: Item) -> None:
        return None


async def hold(ref: ActorRef[Any]) -> asyncio.Event:
    """Park ``ref`` inside ``receive``; set the returned event to let it go on."""
    entered, release = asyncio.Event(), asyncio.Event()
    await ref.tell(Hold(entered, release))
    await entered.wait()
    return release


def items(handled: list[object]) -> list[int]:
    return [m.n for m in handled if isinstance(m, Item)]


# -- the system lane ---------------------------------------------------------------


async def test_stop_is_served_before_a_full_user_lane() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, handled, props=Props(mailbox=MailboxConfig(capacity=50)))
        release = await hold(ref)
        for i in range(50):
            await ref.tell(Item(i))
        assert kit.mailbox_room(ref) == 0
        stopping = asyncio.create_task(kit.system.stop(ref))
        # the Stop is queued behind the held message
        await kit.eventually(lambda: kit.mailbox_depth(ref, "system") == 1)
        release.set()
        await stopping
        assert not ref.is_alive
        assert handled == []  # none of the 50 queued user messages ran


async def test_terminated_is_served_before_queued_user_messages() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        target = await kit.spawn(Idle, name="target")
        watcher = await kit.spawn(Recorder, handled, target)
        release = await hold(watcher)
        for i in range(20):
            await watcher.tell(Item(i))
        await kit.system.stop(target)
        release.set()
        result = await watcher.ask(Dump())
        assert result[0] == Terminated(target, None)
        assert items(result) == list(range(20))


# -- backpressure ------------------------------------------------------------------


async def test_backpressure_tell_waits_until_the_actor_takes_a_message() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, handled, props=Props(mailbox=MailboxConfig(capacity=2)))
        release = await hold(ref)
        await ref.tell(Item(1))
        await ref.tell(Item(2))
        blocked = asyncio.create_task(ref.tell(Item(3)))
        await kit.eventually(lambda: kit.blocked_senders(ref) == 1)  # waiting for room
        assert not blocked.done()  # the actor is held: no room can appear
        assert items(handled) == []
        release.set()
        await blocked
        assert items(await ref.ask(Dump())) == [1, 2, 3]


async def test_tell_timeout_raises_send_timeout_error_and_sends_nothing() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(
            Recorder, handled, name="slow", props=Props(mailbox=MailboxConfig(capacity=1))
        )
        release = await hold(ref)
        await ref.tell(Item(1))
        with pytest.raises(SendTimeoutError) as info:
            await ref.tell(Item(2), timeout=0.01)
        assert isinstance(info.value, TimeoutError)
        assert isinstance(info.value, OmniError)
        assert info.value.actor == "/slow"
        assert info.value.timeout == 0.01
        assert "/slow" in str(info.value)
        assert kit.blocked_senders(ref) == 0  # the timed-out sender left no trace
        release.set()
        await ref.tell(Item(3), timeout=1)
        assert items(await ref.ask(Dump())) == [1, 3]


async def test_tell_timeout_is_not_hit_when_room_appears_in_time() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, handled, props=Props(mailbox=MailboxConfig(capacity=1)))
        release = await hold(ref)
        await ref.tell(Item(1))
        sending = asyncio.create_task(ref.tell(Item(2), timeout=5))
        await kit.eventually(lambda: kit.blocked_senders(ref) == 1)
        release.set()
        await sending
        assert items(await ref.ask(Dump())) == [1, 2]


async def test_a_sender_waiting_for_room_fails_when_the_actor_stops() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(
            Recorder, [], name="busy", props=Props(mailbox=MailboxConfig(capacity=1))
        )
        release = await hold(ref)
        await ref.tell(Item(1))
        blocked = asyncio.create_task(ref.tell(Item(2)))
        await kit.eventually(lambda: kit.blocked_senders(ref) == 1)
        stopping = asyncio.create_task(kit.system.stop(ref))
        await kit.eventually(lambda: kit.mailbox_depth(ref, "system") == 1)
        release.set()
        await stopping
        with pytest.raises(ActorStoppedError, match="/busy"):
            await blocked


# -- drop_oldest and fail ------------------------------------------------------------


async def test_drop_oldest_drops_the_oldest_keeps_the_newest_in_order() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        config = MailboxConfig(capacity=3, overflow="drop_oldest")
        ref = await kit.spawn(
            Recorder, [], forward=probe.ref, name="lossy", props=Props(mailbox=config)
        )
        release = await hold(ref)
        dropped_ask = asyncio.create_task(ref.ask(Item(1)))
        await kit.eventually(lambda: kit.queued_messages(ref) == [Item(1)])
        await ref.tell(Item(2))
        await ref.tell(Item(3))
        await ref.tell(Item(4))  # full: drops the ask of Item(1)
        await ref.tell(Item(5))  # drops Item(2)
        with pytest.raises(MessageDroppedError, match="drop_oldest") as info:
            await dropped_ask
        assert info.value.actor == "/lossy"
        assert kit.queued_messages(ref) == [Item(3), Item(4), Item(5)]
        release.set()
        assert await probe.receive_messages(3) == [Item(3), Item(4), Item(5)]


async def test_drop_oldest_never_blocks_a_sender() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        config = MailboxConfig(capacity=2, overflow="drop_oldest")
        ref = await kit.spawn(Recorder, handled, props=Props(mailbox=config))
        release = await hold(ref)
        for i in range(100):
            await ref.tell(Item(i), timeout=0)
        assert kit.queued_messages(ref) == [Item(98), Item(99)]
        release.set()


async def test_fail_policy_raises_mailbox_full_naming_actor_and_capacity() -> None:
    async with ActorTestKit() as kit:
        probe = await kit.create_probe()
        config = MailboxConfig(capacity=2, overflow="fail")
        ref = await kit.spawn(
            Recorder, [], forward=probe.ref, name="strict", props=Props(mailbox=config)
        )
        release = await hold(ref)
        await ref.tell(Item(1))
        await ref.tell(Item(2))
        with pytest.raises(MailboxFullError) as info:
            await ref.tell(Item(3))
        assert isinstance(info.value, OmniError)
        assert info.value.actor == "/strict"
        assert info.value.capacity == 2
        assert "/strict" in str(info.value)
        assert "2 messages" in str(info.value)
        with pytest.raises(MailboxFullError):
            await ref.ask(Item(4))
        release.set()
        assert await probe.receive_messages(2) == [Item(1), Item(2)]
        await ref.tell(Item(5))  # room again
        await probe.expect_message(Item(5))


async def test_class_mailbox_default_and_spawn_override() -> None:
    class Strict(Recorder):
        mailbox = MailboxConfig(capacity=1, overflow="fail")

    async with ActorTestKit() as kit:
        strict = await kit.spawn(Strict, [])
        release = await hold(strict)
        await strict.tell(Item(1))
        with pytest.raises(MailboxFullError):
            await strict.tell(Item(2))
        release.set()
        roomy = await kit.spawn(
            Strict, [], props=Props(mailbox=MailboxConfig(capacity=3, overflow="fail"))
        )
        release = await hold(roomy)
        for i in range(3):
            await roomy.tell(Item(i))
        with pytest.raises(MailboxFullError) as info:
            await roomy.tell(Item(3))
        assert info.value.capacity == 3
        release.set()


# -- order and fairness --------------------------------------------------------------


async def test_fifo_across_many_concurrent_senders() -> None:
    handled: list[object] = []
    sent: list[int] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, handled, props=Props(mailbox=MailboxConfig(capacity=4)))

        async def sender(base: int) -> None:
            for i in range(25):
                await ref.tell(Item(base + i))
                # No await between the mailbox append and this line: ``sent`` is the
                # exact order in which messages entered the mailbox.
                sent.append(base + i)
                if i % 3 == 0:
                    # The behaviour under test: senders interleaving at every loop step.
                    await asyncio.sleep(0)

        await asyncio.gather(*(sender(k * 1000) for k in range(20)))
        processed = items(await ref.ask(Dump()))
    assert len(processed) == 500
    assert processed == sent
    for k in range(20):
        mine = [n for n in processed if n // 1000 == k]
        assert mine == [k * 1000 + i for i in range(25)]


async def test_waiting_senders_get_room_in_arrival_order() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, handled, props=Props(mailbox=MailboxConfig(capacity=1)))
        release = await hold(ref)
        await ref.tell(Item(0))
        waiting = []
        for i in range(1, 11):
            waiting.append(asyncio.create_task(ref.tell(Item(i))))
            # each one waits before the next is sent: their arrival order is known
            await kit.eventually(lambda n=i: kit.blocked_senders(ref) == n)
        assert kit.blocked_senders(ref) == 10
        release.set()
        await asyncio.gather(*waiting)
        assert items(await ref.ask(Dump())) == list(range(11))


async def test_a_new_sender_does_not_overtake_a_woken_waiter() -> None:
    box = Mailbox("/box", MailboxConfig(capacity=1))
    await box.push_user(("first", None))
    waiter = asyncio.create_task(box.push_user(("waiter", None)))
    await eventually(lambda: box.waiting_senders == 1)
    assert box.pop_user()[0] == "first"  # room for exactly one: the waiter's
    newcomer = asyncio.create_task(box.push_user(("newcomer", None)))
    # One loop step, the interleaving under test: the newcomer runs while the woken
    # waiter has not yet taken its slot.
    await asyncio.sleep(0)
    await waiter
    assert [env[0] for env in box.user] == ["waiter"]
    assert not newcomer.done()
    box.pop_user()
    await newcomer
    assert [env[0] for env in box.user] == ["newcomer"]


async def test_a_cancelled_waiting_sender_does_not_hold_up_the_next() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, handled, props=Props(mailbox=MailboxConfig(capacity=1)))
        release = await hold(ref)
        await ref.tell(Item(1))
        first = asyncio.create_task(ref.tell(Item(2)))
        second = asyncio.create_task(ref.tell(Item(3)))
        await kit.eventually(lambda: kit.blocked_senders(ref) == 2)
        first.cancel()
        release.set()
        await asyncio.wait_for(second, 1)
        assert first.cancelled()
        assert items(await ref.ask(Dump())) == [1, 3]


async def test_a_woken_sender_cancelled_before_it_runs_passes_the_slot_on() -> None:
    box = Mailbox("/box", MailboxConfig(capacity=1))
    await box.push_user(("a", None))
    first = asyncio.create_task(box.push_user(("first", None)))
    second = asyncio.create_task(box.push_user(("second", None)))
    await eventually(lambda: box.waiting_senders == 2)
    box.pop_user()  # wakes ``first``...
    first.cancel()  # ...which is cancelled before it can take the free slot
    await asyncio.wait_for(second, 1)
    assert first.cancelled()
    assert [env[0] for env in box.user] == ["second"]
    assert box.waiting_senders == 0


async def test_close_wakes_every_waiting_sender_with_actor_stopped() -> None:
    box = Mailbox("/box", MailboxConfig(capacity=1))
    await box.push_user(("a", None))
    waiting = [asyncio.create_task(box.push_user((i, None))) for i in range(3)]
    await eventually(lambda: box.waiting_senders == 3)
    assert [env[0] for env in box.close()] == ["a"]
    for task in waiting:
        with pytest.raises(ActorStoppedError, match="/box"):
            await task
    assert box.push_system("late") is False
    with pytest.raises(ActorStoppedError):
        await box.push_user(("late", None))


# -- configuration -----------------------------------------------------------------


def test_mailbox_config_defaults_and_validation() -> None:
    config = MailboxConfig()
    assert (config.capacity, config.overflow, config.stash_capacity) == (
        1000,
        "backpressure",
        1000,
    )
    with pytest.raises(ValueError, match=r"capacity must be >= 1, got 0"):
        MailboxConfig(capacity=0)
    with pytest.raises(ValueError, match="capacity"):
        MailboxConfig(capacity=-5)
    with pytest.raises(ValueError, match="unknown overflow policy 'lose_all'"):
        MailboxConfig(overflow="lose_all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stash_capacity must be >= 0"):
        MailboxConfig(stash_capacity=-1)
    assert MailboxConfig(capacity=1, overflow="fail", stash_capacity=0).stash_capacity == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.capacity = 5  # type: ignore[misc]
