"""``ActorSystem``: spawn and lookup, start failures, ordered shutdown, no stray tasks."""

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
    OmniError,
    Props,
    RestartIntensityExceededError,
    StartTimeoutError,
    SupervisorStrategy,
    run,
)
from omni_actors.testing.inspection import actor_instance, terminated

Tree = dict[str, "Tree"]
"""Child names, each mapped to that child's own children."""


@dataclass
class Ping:
    pass


@dataclass
class Crash:
    pass


class Node(Actor[Ping | Crash]):
    """Logs its start and stop; spawns the children it is given, nested as a tree."""

    def __init__(self, log: list[str], children: Tree | None = None) -> None:
        self.log = log
        self.tree = children or {}

    async def on_start(self) -> None:
        self.log.append(f"start {self.context.path}")
        for name, grandchildren in self.tree.items():
            await self.context.spawn(Node, self.log, grandchildren, name=name)

    async def on_stop(self) -> None:
        self.log.append(f"stop {self.context.path}")

    async def receive(self, message: Ping | Crash) -> str:
        if isinstance(message, Crash):
            raise RuntimeError(f"{self.context.path} crashed")
        return self.context.path


class BrokenStart(Actor[Ping]):
    """Spawns a child, then fails to start."""

    def __init__(self, log: list[str], error: Exception) -> None:
        self.log = log
        self.error = error

    async def on_start(self) -> None:
        await self.context.spawn(Node, self.log, name="early")
        raise self.error


class HangingStart(Actor[Ping]):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def on_start(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.log.append("on_start cancelled")
            raise


class StuckReceive(Actor[Ping]):
    """Its ``receive`` never returns, so a graceful stop can never happen."""

    def __init__(self, entered: asyncio.Event) -> None:
        self.entered = entered

    async def receive(self, message: Ping) -> None:
        self.entered.set()
        await asyncio.Event().wait()


class StuckStop(Actor[Ping]):
    async def on_stop(self) -> None:
        await asyncio.Event().wait()


class StuckChildParent(Node):
    """A node whose only child never finishes its current message."""

    def __init__(self, log: list[str], entered: asyncio.Event) -> None:
        super().__init__(log)
        self.entered = entered

    async def on_start(self) -> None:
        await super().on_start()
        child = await self.context.spawn(StuckReceive, self.entered, name="stuck")
        await child.tell(Ping())


class PermanentKid(Node):
    """Supervises one ``permanent`` child called ``kid``."""

    async def on_start(self) -> None:
        await super().on_start()
        await self.context.spawn(Node, self.log, name="kid", props=Props(restart="permanent"))


def other_tasks() -> list[asyncio.Task[object]]:
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not current]


# -- spawn and lookup -----------------------------------------------------------------


async def test_lookup_by_name_and_nested_path() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        tree: Tree = {"a": {"deep": {}}, "b": {}}
        top = await system.spawn(Node, log, tree, name="top")
        assert system.lookup("top") == top
        assert system.lookup("/top") == top
        assert await system.lookup("top/a").ask(Ping()) == "/top/a"
        assert await system.lookup("/top/b").ask(Ping()) == "/top/b"
        assert await system.lookup("/top/a/deep/").ask(Ping()) == "/top/a/deep"
        assert log == ["start /top", "start /top/a", "start /top/a/deep", "start /top/b"]


async def test_lookup_of_an_unknown_path_raises_actor_not_found() -> None:
    async with ActorSystem() as system:
        top = await system.spawn(Node, [], {"a": {}}, name="top")
        with pytest.raises(ActorNotFoundError, match="no live actor at '/top/c'") as info:
            system.lookup("top/c")
        assert isinstance(info.value, LookupError)
        assert isinstance(info.value, OmniError)
        with pytest.raises(ActorNotFoundError):
            system.lookup("a")  # children are not top-level names
        with pytest.raises(ActorNotFoundError):
            system.lookup("/")  # the root is not an actor users can reach
        await system.stop(top)
        with pytest.raises(ActorNotFoundError):
            system.lookup("top")
        with pytest.raises(ActorNotFoundError):
            system.lookup("top/a")


async def test_names_are_unique_among_siblings_and_free_again_after_stop() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        first = await system.spawn(Node, log, {"x": {}}, name="n")
        with pytest.raises(ActorNameTakenError, match="already has a child named 'n'") as info:
            await system.spawn(Node, log, name="n")
        assert isinstance(info.value, ValueError)
        assert system.lookup("n") == first  # the refused spawn did not replace it
        instance = actor_instance(first)
        assert instance is not None
        with pytest.raises(ActorNameTakenError, match="/n already has a child named 'x'"):
            await instance.context.spawn(Node, log, name="x")
        await system.stop(first)
        second = await system.spawn(Node, log, name="n")
        assert system.lookup("n") == second != first


async def test_invalid_spawn_arguments_are_refused() -> None:
    async with ActorSystem() as system:
        with pytest.raises(ValueError, match="no '/'"):
            await system.spawn(Node, [], name="a/b")
        with pytest.raises(ValueError, match="non-empty"):
            await system.spawn(Node, [], name="")
        with pytest.raises(TypeError, match="Actor subclass"):
            await system.spawn(object, name="x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="restart must be one of"):
            await system.spawn(Node, [], name="r", props=Props(restart="sometimes"))  # type: ignore[arg-type]
        a, b = await system.spawn(Node, []), await system.spawn(Node, [])
        assert a.name != b.name  # generated names are unique
        assert system.lookup(a.name) == a


async def test_spawn_raises_what_on_start_raised_and_registers_nothing() -> None:
    log: list[str] = []
    error = LookupError("no weights at /models/x")
    async with ActorSystem() as system:
        with pytest.raises(LookupError) as info:
            await system.spawn(BrokenStart, log, error, name="broken")
        assert info.value is error
        with pytest.raises(ActorNotFoundError):
            system.lookup("broken")
        with pytest.raises(ActorNotFoundError):
            system.lookup("broken/early")
        # The child it had started was stopped with it.
        assert log == ["start /broken/early", "stop /broken/early"]
        assert await system.spawn(Node, log, name="broken")  # the name is free again


async def test_start_timeout_stops_the_actor_and_registers_nothing() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        with pytest.raises(StartTimeoutError) as info:
            await system.spawn(HangingStart, log, name="slow", props=Props(start_timeout=0.02))
        assert isinstance(info.value, TimeoutError)
        assert info.value.actor == "/slow"
        assert "/slow did not finish on_start within 0.02s" in str(info.value)
        assert log == ["on_start cancelled"]
        with pytest.raises(ActorNotFoundError):
            system.lookup("slow")
        assert await system.spawn(Node, log, name="slow")


async def test_spawn_before_start_is_an_error() -> None:
    system = ActorSystem()
    with pytest.raises(RuntimeError, match="not started"):
        await system.spawn(Node, [])


# -- shutdown --------------------------------------------------------------------------


async def test_shutdown_stops_newest_first_and_children_before_parents() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        await system.spawn(Node, log, {"a1": {"a1x": {}, "a1y": {}}, "a2": {}}, name="a")
        await system.spawn(Node, log, {"b1": {}}, name="b")
        await system.spawn(Node, log, name="c")
        log.clear()
    assert log == [
        "stop /c",
        "stop /b/b1",
        "stop /b",
        "stop /a/a2",
        "stop /a/a1/a1y",
        "stop /a/a1/a1x",
        "stop /a/a1",
        "stop /a",
    ]
    assert other_tasks() == []


async def test_an_actor_stuck_in_receive_is_killed_and_shutdown_completes() -> None:
    log: list[str] = []
    entered = asyncio.Event()
    system = ActorSystem(stop_timeout=0.02)
    async with system:
        await system.spawn(Node, log, name="first")
        stuck = await system.spawn(StuckReceive, entered, name="stuck")
        await stuck.tell(Ping())
        await entered.wait()
        await system.spawn(Node, log, name="last")
    assert log == ["start /first", "start /last", "stop /last", "stop /first"]
    assert not stuck.is_alive
    assert isinstance(await terminated(stuck), ActorStoppedError)  # killed
    assert other_tasks() == []


async def test_an_actor_stuck_in_on_stop_is_killed_and_shutdown_completes() -> None:
    log: list[str] = []
    system = ActorSystem(stop_timeout=0.02)
    async with system:
        await system.spawn(Node, log, name="first")
        stuck = await system.spawn(StuckStop, name="stuck")
    assert log == ["start /first", "stop /first"]
    assert not stuck.is_alive
    assert other_tasks() == []


async def test_time_spent_stopping_children_does_not_count_against_the_parent() -> None:
    log: list[str] = []
    entered = asyncio.Event()
    system = ActorSystem(stop_timeout=0.02)
    async with system:
        parent = await system.spawn(StuckChildParent, log, entered, name="parent")
        await entered.wait()
    # The stuck child was killed after its deadline; the parent still stopped gracefully.
    assert log == ["start /parent", "stop /parent"]
    assert await terminated(parent) is None
    assert other_tasks() == []


async def test_no_task_survives_a_root_escalation() -> None:
    log: list[str] = []
    system = ActorSystem(strategy=SupervisorStrategy(max_restarts=0))
    async with system:
        await system.spawn(Node, log, {"kid": {}}, name="calm")
        crashing = await system.spawn(Node, log, name="crashing", props=Props(restart="permanent"))
        with pytest.raises(RuntimeError, match="crashed"):
            await crashing.ask(Crash())
        reason = await asyncio.wait_for(system.wait_terminated(), 1)
        assert isinstance(reason, RestartIntensityExceededError)
        assert system.is_terminated
        with pytest.raises(ActorStoppedError):
            await system.spawn(Node, log)
    assert other_tasks() == []
    assert "stop /calm/kid" in log
    assert log.index("stop /calm/kid") < log.index("stop /calm")


async def test_no_task_survives_an_escalation_below_the_root() -> None:
    log: list[str] = []
    system = ActorSystem()
    async with system:
        no_restarts = SupervisorStrategy(max_restarts=0)
        parent = await system.spawn(PermanentKid, log, name="p", props=Props(strategy=no_restarts))
        kid = system.lookup("p/kid")
        with pytest.raises(RuntimeError, match="crashed"):
            await kid.ask(Crash())
        reason = await terminated(parent)
        assert isinstance(reason, RestartIntensityExceededError)
        assert not system.is_terminated  # the temporary parent stopped; the root lives
        assert await (await system.spawn(Node, log)).ask(Ping())
    assert other_tasks() == []


async def test_after_shutdown_spawn_is_refused_and_lookup_finds_nothing() -> None:
    system = ActorSystem()
    async with system:
        await system.spawn(Node, [], name="n")
    with pytest.raises(ActorStoppedError, match="shut down"):
        await system.spawn(Node, [], name="late")
    with pytest.raises(ActorNotFoundError):
        system.lookup("n")
    assert system.is_terminated
    assert await system.wait_terminated() is None
    await system.shutdown()  # a second shutdown is a no-op
    assert other_tasks() == []


def test_run_drives_a_system_on_uvloop() -> None:
    async def main() -> tuple[str, str]:
        loop_module = type(asyncio.get_running_loop()).__module__
        async with ActorSystem() as system:
            ref = await system.spawn(Node, [], name="n")
            path: str = await ref.ask(Ping())
        return path, loop_module

    path, loop_module = run(main())
    assert path == "/n"
    assert loop_module.startswith("uvloop")
