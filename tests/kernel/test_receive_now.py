"""``Actor.receive_now``: a stream's hot message reaching an idle actor is handled in
the sender's ``tell``, with no wake-up of the actor's task; the order of messages, the
rest of a message's handling, failures and subclasses that wrap ``receive`` behave as
through the mailbox."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from omni_actors import Actor, Backoff, ControlMessage, Props, SupervisorStrategy
from omni_actors.testing import ActorTestKit

NO_BACKOFF = SupervisorStrategy(backoff=Backoff(min_s=0.0, max_s=0.0, jitter=0.0))


@dataclass(frozen=True)
class Now:
    """Taken at once when the actor is idle; ``rest`` asks for a rest that awaits,
    ``boom`` for a failure."""

    n: int
    rest: bool = False
    boom: bool = False


@dataclass(frozen=True)
class Item:
    n: int


@dataclass(frozen=True)
class Crash(ControlMessage):
    """Overtakes what is queued, and fails the actor."""


@dataclass(frozen=True)
class Hold:
    """Keeps the actor inside ``receive`` until ``release`` is set."""

    entered: asyncio.Event
    release: asyncio.Event


Rest = Callable[[], Awaitable[None]]


class Recorder(Actor[Now | Item | Hold | Crash]):
    receives_now = frozenset({Now})

    def __init__(self, log: list[str], starts: list[int]) -> None:
        self.log = log
        self.open = asyncio.Event()
        self.open.set()
        starts.append(len(starts))

    def receive_now(self, message: Now | Item | Hold | Crash) -> Rest | None:
        assert isinstance(message, Now)
        if message.boom:
            raise ValueError(f"boom {message.n}")
        self.log.append(f"now {message.n}")
        return functools.partial(self._rest, message.n) if message.rest else None

    async def _rest(self, n: int) -> None:
        await self.open.wait()  # the rest may await: it runs in the actor's own task
        self.log.append(f"rest {n}")

    async def receive(self, message: Now | Item | Hold | Crash) -> None:
        match message:
            case Now():
                rest = self.receive_now(message)
                if rest is not None:
                    await rest()
            case Item(n=n):
                self.log.append(f"item {n}")
            case Hold(entered=entered, release=release):
                self.log.append("hold")
                entered.set()
                await release.wait()
            case Crash():
                raise ValueError("crash")


class Wrapped(Recorder):
    """Wraps ``receive`` only: it must see every message."""

    async def receive(self, message: Now | Item | Hold | Crash) -> None:
        self.log.append("wrapped")
        await super().receive(message)


async def test_an_idle_actor_takes_the_message_inside_tell() -> None:
    log: list[str] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, log, [])
        await ref.tell(Now(1))
        # Nothing yielded to the loop since the tell: only the fast path can have run.
        assert log == ["now 1"]
        await ref.tell(Item(2))
        assert log == ["now 1"]  # an ordinary message waits for the actor's task
        await kit.eventually(lambda: len(log) == 2, what="the item handled")
        assert log == ["now 1", "item 2"]


async def test_a_busy_actor_gets_the_message_through_its_mailbox_in_order() -> None:
    log: list[str] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, log, [])
        entered, release = asyncio.Event(), asyncio.Event()
        await ref.tell(Hold(entered, release))
        await entered.wait()
        await ref.tell(Now(1))
        await ref.tell(Item(2))
        await ref.tell(Now(3))
        assert log == ["hold"]  # busy: none was taken at once
        release.set()
        await kit.eventually(lambda: len(log) == 4, what="every message handled")
        assert log == ["hold", "now 1", "item 2", "now 3"]


async def test_the_rest_runs_in_the_actors_task_before_the_next_message() -> None:
    log: list[str] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, log, [])
        await ref.tell(Now(1, rest=True))
        await ref.tell(Now(2))  # not idle: the rest of message 1 is queued
        await ref.tell(Item(3))
        assert log == ["now 1"]
        await kit.eventually(lambda: len(log) == 4, what="every message handled")
        assert log == ["now 1", "rest 1", "now 2", "item 3"]


async def test_a_failure_in_receive_now_is_supervised_as_one_in_receive() -> None:
    log: list[str] = []
    starts: list[int] = []
    async with ActorTestKit(strategy=NO_BACKOFF) as kit:
        ref = await kit.spawn(Recorder, log, starts, props=Props(restart="permanent"))
        await ref.tell(Now(1, boom=True))
        await kit.eventually(lambda: len(starts) == 2, what="the actor restarted")
        await ref.tell(Item(2))
        await kit.eventually(lambda: log == ["item 2"], what="the restarted actor serving")


async def test_the_rest_of_a_message_is_not_run_by_a_restarted_instance() -> None:
    log: list[str] = []
    starts: list[int] = []
    async with ActorTestKit(strategy=NO_BACKOFF) as kit:
        ref = await kit.spawn(Recorder, log, starts, props=Props(restart="permanent"))
        await ref.tell(Now(1, rest=True))  # its rest is queued ...
        await ref.tell(Crash())  # ... and this overtakes it: the instance fails first
        await kit.eventually(lambda: len(starts) == 2, what="the actor restarted")
        await ref.tell(Item(2))
        await kit.eventually(lambda: "item 2" in log, what="the restarted actor serving")
        assert log == ["now 1", "item 2"]  # no "rest 1" from the new instance


async def test_a_subclass_wrapping_receive_sees_every_message() -> None:
    assert Wrapped.receives_now == frozenset()
    log: list[str] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Wrapped, log, [])
        await ref.tell(Now(1))
        assert log == []
        await kit.eventually(lambda: len(log) == 2, what="the message handled")
        assert log == ["wrapped", "now 1"]


async def test_an_ask_never_takes_the_fast_path() -> None:
    log: list[str] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Recorder, log, [])
        assert await ref.ask(Now(1), timeout=5) is None
        assert log == ["now 1"]
