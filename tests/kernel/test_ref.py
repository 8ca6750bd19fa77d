"""``ActorRef``: type checks on send, ask replies and deadlines, stopped actors, identity."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pytest

from omni_actors import (
    Actor,
    ActorRef,
    ActorStoppedError,
    AskTimeoutError,
    Backoff,
    MailboxConfig,
    MessageTypeError,
    OmniError,
    Props,
    SupervisorStrategy,
)
from omni_actors.testing import ActorTestKit

M = TypeVar("M")
N = TypeVar("N")


@dataclass
class Ping:
    n: int = 0


@dataclass
class Pong:
    n: int = 0


@dataclass
class Block:
    """Blocks ``receive`` until ``release`` is set, then replies ``reply``."""

    entered: asyncio.Event
    release: asyncio.Event
    reply: object = None


@dataclass
class Fail:
    error: BaseException


class Worker(Actor[Ping | Block | Fail]):
    """Replies to ``Ping(n)`` with ``n * 2``, blocks on ``Block``, raises ``Fail.error``."""

    def __init__(self, handled: list[object] | None = None) -> None:
        self.handled = handled if handled is not None else []

    async def receive(self, message: Ping | Block | Fail) -> Any:
        self.handled.append(message)
        match message:
            case Ping(n):
                return n * 2
            case Block(entered, release, reply):
                entered.set()
                await release.wait()
                return reply
            case Fail(error):
                raise error
        return None


class OnlyPing(Actor[Ping]):
    async def receive(self, message: Ping) -> int:
        return message.n


class Base(Actor[M]):
    """A generic base: subclasses pick the message type."""

    async def receive(self, message: M) -> Any:
        return message


class PingBase(Base[Ping]):
    pass


class PingLeaf(PingBase):
    """Not generic itself: inherits what its parent declared."""


class Middle(Base[N]):
    pass


class PingPongLeaf(Middle[Ping | Pong]):
    pass


class Anything(Actor[Any]):
    async def receive(self, message: Any) -> Any:
        return message


class Silent(Actor[Ping]):
    """Never answers."""

    async def receive(self, message: Ping) -> None:
        await asyncio.Event().wait()


class EngineError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"engine failed with code {code}")
        self.code = code


async def block(
    ref: ActorRef[Any], reply: object = None, timeout: float = 5
) -> tuple[asyncio.Task[Any], asyncio.Event]:
    """Ask ``ref`` a ``Block``; returns the pending ask and the event that releases it."""
    entered, release = asyncio.Event(), asyncio.Event()
    asking = asyncio.create_task(ref.ask(Block(entered, release, reply), timeout=timeout))
    await entered.wait()
    return asking, release


# -- type checks -----------------------------------------------------------------------


async def test_tell_rejects_a_type_outside_the_declared_union() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker, handled, name="worker")
        with pytest.raises(MessageTypeError) as info:
            await ref.tell(Pong())  # type: ignore[arg-type]
        error = info.value
        assert isinstance(error, TypeError)
        assert isinstance(error, OmniError)
        assert error.actor == "/worker"
        assert error.message_type is Pong
        assert error.accepted == (Ping, Block, Fail)
        text = str(error)
        assert "/worker" in text
        assert "does not accept Pong" in text
        assert "Ping, Block, Fail" in text
        with pytest.raises(MessageTypeError, match="does not accept str"):
            await ref.ask("ping")  # type: ignore[arg-type]
        assert await ref.ask(Ping(1)) == 2
        assert handled == [Ping(1)]  # rejected messages never reached the actor


async def test_tell_rejects_a_type_other_than_a_single_declared_type() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(OnlyPing, name="single")
        with pytest.raises(MessageTypeError, match=r"/single does not accept int.*: Ping\.") as e:
            await ref.tell(3)  # type: ignore[arg-type]
        assert e.value.accepted == (Ping,)
        assert await ref.ask(Ping(7)) == 7


async def test_declared_type_is_inherited_through_generic_subclasses() -> None:
    assert PingBase.accepts == (Ping,)
    assert PingLeaf.accepts == (Ping,)
    assert PingPongLeaf.accepts == (Ping, Pong)
    async with ActorTestKit() as kit:
        for cls in (PingBase, PingLeaf):
            ref = await kit.spawn(cls)
            assert await ref.ask(Ping(1)) == Ping(1)
            with pytest.raises(MessageTypeError, match="does not accept Pong"):
                await ref.tell(Pong())  # type: ignore[arg-type]
        both = await kit.spawn(PingPongLeaf)
        assert await both.ask(Pong(2)) == Pong(2)
        with pytest.raises(MessageTypeError, match="does not accept str"):
            await both.tell("x")  # type: ignore[arg-type]


async def test_actor_of_any_accepts_every_message() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Anything)
        for message in (1, "text", None, Ping(), [1, 2], object):
            assert await ref.ask(message) is message


class Shutdown:
    pass


class ControlledBase(Actor[M | Shutdown]):
    async def receive(self, message: M | Shutdown) -> Any:
        return type(message).__name__


class ControlledPing(ControlledBase[Ping]):
    pass


class Reordered(Generic[N, M], Actor[M]):
    async def receive(self, message: M) -> Any:
        return message


class ReorderedPing(Reordered[int, Ping]):
    pass


def test_generic_base_union_with_fixed_types_keeps_them() -> None:
    assert set(ControlledPing.accepts) == {Ping, Shutdown}


def test_generic_base_with_reordered_parameters() -> None:
    assert ReorderedPing.accepts == (Ping,)


# -- ask ---------------------------------------------------------------------------------


async def test_ask_returns_what_receive_returned() -> None:
    reply = {"tokens": [1, 2, 3]}
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker)
        assert await ref.ask(Ping(21)) == 42
        asking, release = await block(ref, reply)
        release.set()
        assert await asking is reply


async def test_ask_times_out_when_the_callee_never_replies() -> None:
    async with ActorTestKit(stop_timeout=0.05) as kit:
        ref = await kit.spawn(Silent, name="silent")
        with pytest.raises(AskTimeoutError) as info:
            await ref.ask(Ping(), timeout=0.02)
        error = info.value
        assert isinstance(error, TimeoutError)
        assert isinstance(error, OmniError)
        assert error.actor == "/silent"
        assert error.timeout == 0.02
        assert "ask to /silent with Ping got no reply within 0.02s" in str(error)


def asyncio_complaints(caplog: pytest.LogCaptureFixture) -> list[str]:
    gc.collect()  # "exception was never retrieved" is reported when a future is collected
    return [r.getMessage() for r in caplog.records if r.name == "asyncio"]


@pytest.mark.filterwarnings("error")
async def test_a_late_reply_is_discarded_quietly(caplog: pytest.LogCaptureFixture) -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker)
        entered, release = asyncio.Event(), asyncio.Event()
        with pytest.raises(AskTimeoutError):
            await ref.ask(Block(entered, release, "late"), timeout=0.01)
        assert entered.is_set()
        release.set()  # receive returns "late" to an asker that is gone
        assert await ref.ask(Ping(1)) == 2
        assert ref.is_alive
    assert asyncio_complaints(caplog) == []


@pytest.mark.filterwarnings("error")
async def test_a_late_failure_is_discarded_quietly(caplog: pytest.LogCaptureFixture) -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker)
        blocker, release = await block(ref)
        with pytest.raises(AskTimeoutError):
            await ref.ask(Fail(EngineError(1)), timeout=0.01)  # queued behind the Block
        release.set()
        await blocker
        # The failure is the actor's own (it is temporary: it stops); the asker is gone.
        assert isinstance(await kit.terminated(ref), EngineError)
    assert asyncio_complaints(caplog) == []


async def test_ask_deadline_covers_waiting_for_mailbox_room() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker, handled, props=Props(mailbox=MailboxConfig(capacity=1)))
        asking, release = await block(ref)
        await ref.tell(Ping(1))  # fills the mailbox
        with pytest.raises(AskTimeoutError):
            await ref.ask(Ping(2), timeout=0.01)
        assert kit.blocked_senders(ref) == 0
        release.set()
        await asking
        assert await ref.ask(Ping(3)) == 6
        assert [m.n for m in handled if isinstance(m, Ping)] == [1, 3]


async def test_a_timeout_raised_by_the_callee_is_not_an_ask_timeout() -> None:
    error = TimeoutError("the engine timed out")
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker)
        with pytest.raises(TimeoutError) as info:
            await ref.ask(Fail(error), timeout=5)
        assert info.value is error
        assert not isinstance(info.value, AskTimeoutError)


async def test_the_callee_error_reaches_the_asker_as_is() -> None:
    error = EngineError(42)
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker)
        with pytest.raises(EngineError) as info:
            await ref.ask(Fail(error))
        assert info.value is error
        assert info.value.code == 42
        lookup = await kit.spawn(Worker)
        with pytest.raises(KeyError, match="missing"):
            await lookup.ask(Fail(KeyError("missing")))


# -- stopped actors ----------------------------------------------------------------------


async def test_tell_and_ask_to_a_stopped_actor_raise_actor_stopped() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker, name="gone")
        assert ref.is_alive
        await kit.system.stop(ref)
        assert not ref.is_alive
        with pytest.raises(ActorStoppedError, match="actor /gone is stopped") as info:
            await ref.tell(Ping())
        assert info.value.actor == "/gone"
        with pytest.raises(ActorStoppedError, match="/gone"):
            await ref.ask(Ping())


async def test_a_failed_temporary_actor_refuses_further_messages() -> None:
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker)
        with pytest.raises(EngineError):
            await ref.ask(Fail(EngineError(1)))
        await kit.terminated(ref)
        assert not ref.is_alive
        with pytest.raises(ActorStoppedError):
            await ref.ask(Ping())


async def test_asks_queued_when_the_actor_stops_fail_instead_of_hanging() -> None:
    handled: list[object] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Worker, handled, name="stopping")
        blocker, release = await block(ref, "done")
        queued = [asyncio.create_task(ref.ask(Ping(i), timeout=5)) for i in range(3)]
        await ref.tell(Ping(99))
        await kit.eventually(lambda: kit.mailbox_depth(ref) == 4)  # the asks and the tell
        stopping = asyncio.create_task(kit.system.stop(ref))
        await kit.eventually(lambda: kit.mailbox_depth(ref, "system") == 1)  # the Stop
        release.set()
        await stopping
        assert await blocker == "done"  # the message in progress still finished
        for ask in queued:
            with pytest.raises(ActorStoppedError, match="/stopping is stopped: stopped before"):
                await ask
        assert len(handled) == 1


async def test_the_ask_in_progress_when_an_actor_is_killed_fails_at_once() -> None:
    async with ActorTestKit(stop_timeout=0.02) as kit:
        ref = await kit.spawn(Worker)
        asking, _ = await block(ref, timeout=1)  # never released
        await kit.system.stop(ref)  # the Stop waits behind the Block: killed
        with pytest.raises(ActorStoppedError, match="stopped before replying"):
            await asking


# -- identity ------------------------------------------------------------------------


class Parent(Actor[Ping]):
    async def on_start(self) -> None:
        await self.context.spawn(Worker, name="child")

    async def receive(self, message: Ping) -> Any:
        return self.context.self_ref


async def test_ref_equality_hash_path_and_name() -> None:
    async with ActorTestKit() as kit:
        parent = await kit.spawn(Parent, name="parent")
        child = kit.system.lookup("parent/child")
        assert await parent.ask(Ping()) == parent  # self_ref is the same ref
        assert kit.system.lookup("/parent") == parent
        assert hash(kit.system.lookup("/parent")) == hash(parent)
        assert {parent: 1, child: 2}[kit.system.lookup("parent")] == 1
        assert len({parent, child, kit.system.lookup("parent/child")}) == 2
        assert parent != child
        assert parent != "/parent"
        assert (parent.name, parent.path) == ("parent", "/parent")
        assert (child.name, child.path) == ("child", "/parent/child")
        assert repr(child) == "ActorRef(/parent/child)"
        assert parent.is_alive
        assert child.is_alive
        await kit.system.stop(parent)
        assert not parent.is_alive
        assert not child.is_alive
        again = await kit.spawn(Parent, name="parent")
        assert again.path == parent.path
        assert again != parent  # a new actor under an old name is a different actor
        assert not parent.is_alive


async def test_a_ref_stays_valid_across_restarts() -> None:
    instant = SupervisorStrategy(backoff=Backoff(min_s=0, max_s=0))
    async with ActorTestKit(strategy=instant) as kit:
        ref = await kit.spawn(Worker, props=Props(restart="permanent"))
        instance = kit.instance(ref)
        with pytest.raises(EngineError):
            await ref.ask(Fail(EngineError(1)))
        assert await ref.ask(Ping(2)) == 4
        assert kit.instance(ref) is not instance  # a fresh instance behind the same ref
        assert ref.is_alive
