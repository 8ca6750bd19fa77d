"""Mailbox lanes and overflow policies; tell/ask semantics and typed errors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pytest

from omni_actors import (
    Actor,
    ActorStoppedError,
    AskTimeoutError,
    MailboxConfig,
    MailboxFullError,
    MessageDroppedError,
    MessageTypeError,
    OmniError,
    SendTimeoutError,
)
from omni_actors.testing import ActorTestKit


@dataclass
class Item:
    n: int


@dataclass
class Hold:
    """Blocks the actor until ``release`` is set."""

    release: asyncio.Event
    entered: asyncio.Event


@dataclass
class Dump:
    pass


class Recorder(Actor[Item | Hold | Dump]):
    def __init__(self) -> None:
        self.seen: list[int] = []

    async def receive(self, message: Item | Hold | Dump) -> Any:
        match message:
            case Item(n):
                self.seen.append(n)
                return n
            case Hold(release, entered):
                entered.set()
                await release.wait()
            case Dump():
                return list(self.seen)
        return None


async def _held(kit: ActorTestKit, config: MailboxConfig) -> tuple[Any, asyncio.Event]:
    ref = await kit.spawn(Recorder, mailbox=config)
    release, entered = asyncio.Event(), asyncio.Event()
    await ref.tell(Hold(release, entered))
    await entered.wait()  # the actor is now inside receive(Hold)
    return ref, release


async def _drained(ref: Any) -> None:
    """Wait until the actor has taken every queued message (a full mailbox would make
    the next ask itself overflow)."""
    for _ in range(100):
        if not ref._cell.mailbox.user:
            return
        await asyncio.sleep(0)
    raise AssertionError("mailbox did not drain")


async def test_backpressure_blocks_tell_until_there_is_room() -> None:
    async with ActorTestKit() as kit:
        ref, release = await _held(kit, MailboxConfig(capacity=2))
        await ref.tell(Item(1))
        await ref.tell(Item(2))
        blocked = asyncio.ensure_future(ref.tell(Item(3)))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        with pytest.raises(SendTimeoutError):
            await ref.tell(Item(99), timeout=0.01)
        release.set()
        await blocked
        assert await ref.ask(Dump()) == [1, 2, 3]


async def test_drop_oldest_drops_and_fails_a_dropped_ask() -> None:
    async with ActorTestKit() as kit:
        ref, release = await _held(kit, MailboxConfig(capacity=2, overflow="drop_oldest"))
        dropped_ask = asyncio.ensure_future(ref.ask(Item(1)))
        await asyncio.sleep(0)
        await ref.tell(Item(2))
        await ref.tell(Item(3))  # drops Item(1)
        await ref.tell(Item(4))  # drops Item(2)
        with pytest.raises(MessageDroppedError, match="drop_oldest"):
            await dropped_ask
        release.set()
        await _drained(ref)
        assert await ref.ask(Dump()) == [3, 4]


async def test_fail_policy_raises_mailbox_full() -> None:
    async with ActorTestKit() as kit:
        ref, release = await _held(kit, MailboxConfig(capacity=1, overflow="fail"))
        await ref.tell(Item(1))
        with pytest.raises(MailboxFullError, match="full") as info:
            await ref.tell(Item(2))
        assert info.value.capacity == 1
        release.set()
        await _drained(ref)
        assert await ref.ask(Dump()) == [1]


async def test_cancelled_sender_passes_its_slot_on() -> None:
    async with ActorTestKit() as kit:
        ref, release = await _held(kit, MailboxConfig(capacity=1))
        await ref.tell(Item(1))
        first = asyncio.ensure_future(ref.tell(Item(2)))
        second = asyncio.ensure_future(ref.tell(Item(3)))
        await asyncio.sleep(0)
        first.cancel()
        release.set()
        await asyncio.wait_for(second, 1)
        assert await ref.ask(Dump()) == [1, 3]


async def test_many_senders_keep_per_sender_order() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, mailbox=MailboxConfig(capacity=3))

        async def send(base: int) -> None:
            for i in range(50):
                await ref.tell(Item(base + i))

        await asyncio.gather(*(send(k * 1000) for k in range(5)))
        seen = await ref.ask(Dump())
        assert len(seen) == 250
        for k in range(5):
            mine = [n for n in seen if k * 1000 <= n < k * 1000 + 50]
            assert mine == sorted(mine)


async def test_system_lane_is_served_before_queued_user_messages() -> None:
    async with ActorTestKit() as kit:
        ref, release = await _held(kit, MailboxConfig(capacity=100))
        for i in range(50):
            await ref.tell(Item(i))
        stopping = asyncio.ensure_future(kit.system.stop(ref))
        await asyncio.sleep(0)
        release.set()
        await stopping
        assert not ref.is_alive
        assert ref._cell.instance is None or ref._cell.instance.seen == []  # type: ignore[attr-defined]


def test_mailbox_config_validation() -> None:
    with pytest.raises(ValueError, match="capacity"):
        MailboxConfig(capacity=0)
    with pytest.raises(ValueError, match="overflow"):
        MailboxConfig(overflow="lose_everything")  # type: ignore[arg-type]


M = TypeVar("M")


class Base(Actor[M], Generic[M]):
    async def receive(self, message: M) -> M:
        return message


class IntOnly(Base[int]):
    pass


class Anything(Actor[Any]):
    async def receive(self, message: Any) -> Any:
        return message


async def test_type_rejection_names_actor_and_type() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, name="rec")
        with pytest.raises(MessageTypeError) as info:
            await ref.tell("text")  # type: ignore[arg-type]
        assert isinstance(info.value, TypeError)
        assert "/rec" in str(info.value)
        assert "str" in str(info.value)
        assert "Item, Hold, Dump" in str(info.value)
        with pytest.raises(MessageTypeError):
            await ref.ask(3.5)  # type: ignore[arg-type]


async def test_declared_types_are_inherited_through_generic_bases() -> None:
    async with ActorTestKit() as kit:
        ints = await kit.spawn(IntOnly)
        assert await ints.ask(4) == 4
        with pytest.raises(MessageTypeError):
            await ints.tell("4")  # type: ignore[arg-type]
        anything = await kit.spawn(Anything)
        assert await anything.ask({"a": 1}) == {"a": 1}


class Silent(Actor[Item]):
    async def receive(self, message: Item) -> None:
        await asyncio.sleep(3600)


class RaisesTimeout(Actor[Item]):
    async def receive(self, message: Item) -> None:
        raise TimeoutError("the engine timed out")


async def test_ask_deadline_fires_even_if_the_callee_never_answers() -> None:
    async with ActorTestKit(stop_timeout=0.1) as kit:
        ref = await kit.spawn(Silent)
        with pytest.raises(AskTimeoutError) as info:
            await ref.ask(Item(1), timeout=0.05)
        assert isinstance(info.value, TimeoutError)
        assert isinstance(info.value, OmniError)


async def test_a_timeout_raised_by_the_callee_is_not_an_ask_timeout() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(RaisesTimeout)
        with pytest.raises(TimeoutError, match="engine timed out") as info:
            await ref.ask(Item(1), timeout=5)
        assert not isinstance(info.value, AskTimeoutError)


async def test_tell_and_ask_to_a_stopped_actor_raise() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder)
        await kit.system.stop(ref)
        assert not ref.is_alive
        with pytest.raises(ActorStoppedError):
            await ref.tell(Item(1))
        with pytest.raises(ActorStoppedError):
            await ref.ask(Item(1))


async def test_pending_asks_fail_when_the_actor_stops() -> None:
    async with ActorTestKit() as kit:
        ref, release = await _held(kit, MailboxConfig(capacity=10))
        asks = [asyncio.ensure_future(ref.ask(Item(i), timeout=5)) for i in range(3)]
        await asyncio.sleep(0)
        stopping = asyncio.ensure_future(kit.system.stop(ref))
        await asyncio.sleep(0)
        release.set()
        await stopping
        for ask in asks:
            with pytest.raises(ActorStoppedError, match="before replying"):
                await ask


async def test_ref_identity_and_names() -> None:
    async with ActorTestKit() as kit:
        a = await kit.spawn(Recorder, name="a")
        again = kit.system.lookup("a")
        assert a == again
        assert hash(a) == hash(again)
        assert a.name == "a"
        assert a.path == "/a"
        assert repr(a) == "ActorRef(/a)"
        b = await kit.spawn(Recorder, name="b")
        assert a != b
