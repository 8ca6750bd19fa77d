"""ActorSystem: spawn, lookup, start failures, ordered shutdown, no stray tasks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from omni_actors import (
    Actor,
    ActorNameTakenError,
    ActorNotFoundError,
    ActorStoppedError,
    ActorSystem,
    StartTimeoutError,
    run,
)


@dataclass
class Ping:
    pass


class Node(Actor[Ping]):
    """Logs start/stop; spawns the children it is given."""

    def __init__(self, log: list[str], children: tuple[str, ...] = ()) -> None:
        self.log = log
        self.children = children

    async def on_start(self) -> None:
        self.log.append(f"start {self.context.path}")
        for name in self.children:
            await self.context.spawn(Node, self.log, name=name)

    async def on_stop(self) -> None:
        self.log.append(f"stop {self.context.path}")

    async def receive(self, message: Ping) -> str:
        return self.context.path


class BrokenStart(Actor[Ping]):
    async def on_start(self) -> None:
        raise LookupError("no weights at /models/x")


class SlowStart(Actor[Ping]):
    async def on_start(self) -> None:
        await asyncio.sleep(3600)


class Stuck(Actor[Ping]):
    async def receive(self, message: Ping) -> None:
        await asyncio.sleep(3600)


async def test_spawn_and_lookup_by_name_and_path() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        top = await system.spawn(Node, log, ("a", "b"), name="top")
        assert system.lookup("top") == top
        assert await system.lookup("top/a").ask(Ping()) == "/top/a"
        assert await system.lookup("/top/b").ask(Ping()) == "/top/b"
        with pytest.raises(ActorNotFoundError, match="/top/c"):
            system.lookup("top/c")
        with pytest.raises(ActorNameTakenError):
            await system.spawn(Node, log, name="top")
        with pytest.raises(ValueError, match="no '/'"):
            await system.spawn(Node, log, name="a/b")
        with pytest.raises(TypeError, match="Actor subclass"):
            await system.spawn(object, name="x")  # type: ignore[arg-type]
        await system.stop(top)
        with pytest.raises(ActorNotFoundError):
            system.lookup("top/a")


async def test_spawn_raises_what_on_start_raised() -> None:
    async with ActorSystem() as system:
        with pytest.raises(LookupError, match="no weights"):
            await system.spawn(BrokenStart, name="broken")
        with pytest.raises(ActorNotFoundError):
            system.lookup("broken")
        with pytest.raises(StartTimeoutError):
            await system.spawn(SlowStart, name="slow", start_timeout=0.05)
        with pytest.raises(ActorNotFoundError):
            system.lookup("slow")


async def test_shutdown_is_ordered_newest_first_children_before_parents() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        await system.spawn(Node, log, ("a1", "a2"), name="a")
        await system.spawn(Node, log, ("b1",), name="b")
        log.clear()
    assert log == ["stop /b/b1", "stop /b", "stop /a/a2", "stop /a/a1", "stop /a"]


async def test_a_stuck_actor_is_killed_after_its_deadline_and_shutdown_completes() -> None:
    log: list[str] = []
    system = ActorSystem(stop_timeout=0.05)
    async with system:
        await system.spawn(Node, log, name="first")
        stuck = await system.spawn(Stuck, name="stuck")
        await stuck.tell(Ping())
        await asyncio.sleep(0)
    assert "stop /first" in log
    assert not stuck.is_alive
    current = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not current] == []


async def test_spawn_after_shutdown_is_refused() -> None:
    system = ActorSystem()
    async with system:
        pass
    with pytest.raises(ActorStoppedError):
        await system.spawn(Node, [], name="late")
    assert system.is_terminated
    assert await system.wait_terminated() is None


def test_run_uses_a_working_loop() -> None:
    async def main() -> str:
        async with ActorSystem() as system:
            ref = await system.spawn(Node, [], name="n")
            result: str = await ref.ask(Ping())
            return result

    assert run(main()) == "/n"
