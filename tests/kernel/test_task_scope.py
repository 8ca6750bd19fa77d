"""``TaskScope``: every task an actor starts is cancelled and awaited when it stops."""

from __future__ import annotations

import asyncio
import logging

import pytest

from omni_actors import Actor, Props, TaskScope
from omni_actors.testing import ActorTestKit


class Starter(Actor[str]):
    """Starts one long task per message in its scope."""

    def __init__(self, ended: list[str]) -> None:
        self.ended = ended

    async def receive(self, message: str) -> None:
        self.context.tasks.create_task(self._work(message), name=f"work {message}")

    async def _work(self, label: str) -> None:
        try:
            await asyncio.Event().wait()  # runs until its owner ends it
        finally:
            self.ended.append(label)


async def test_stopping_an_actor_cancels_and_awaits_its_tasks() -> None:
    ended: list[str] = []
    async with ActorTestKit() as kit:
        ref = await kit.spawn(Starter, ended)
        await ref.ask("a")
        await ref.ask("b")
        assert sorted(t.get_name() for t in kit.live_tasks() if "work" in t.get_name()) == [
            "work a",
            "work b",
        ]
        await kit.system.stop(ref)
        # stop returned: both tasks ran their cleanup before the actor terminated
        assert sorted(ended) == ["a", "b"]
        assert not [t for t in kit.live_tasks() if "work" in t.get_name()]


async def test_a_restart_cancels_the_old_instances_tasks() -> None:
    ended: list[str] = []

    class Crashy(Starter):
        async def receive(self, message: str) -> None:
            if message == "crash":
                raise RuntimeError("boom")
            await super().receive(message)

    async with ActorTestKit() as kit:
        ref = await kit.spawn(Crashy, ended, props=Props(restart="permanent"))
        await ref.ask("a")
        with pytest.raises(RuntimeError):
            await ref.ask("crash")
        await kit.eventually(lambda: ended == ["a"], what="the old instance's task ended")
        await ref.ask("b")  # the restarted instance starts tasks as before
        assert [t.get_name() for t in kit.live_tasks() if "work" in t.get_name()] == ["work b"]


async def test_a_task_that_ignores_cancellation_is_named_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release, running = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        running.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    scope = TaskScope("/owner")
    task = scope.create_task(stubborn(), name="stubborn")
    await running.wait()
    with caplog.at_level(logging.ERROR, logger="omni_actors"):
        abandoned = await scope.cancel(0.05, "the owner stopped")
    assert abandoned == [task]
    (record,) = [r for r in caplog.records if "abandoned" in r.getMessage()]
    assert "'stubborn'" in record.getMessage()
    assert "the owner stopped" in record.getMessage()
    assert scope.tasks == [task]  # still owned
    release.set()
    await task
    assert len(scope) == 0


async def test_a_failed_task_is_logged_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    async def fail() -> None:
        raise ValueError("lost")

    scope = TaskScope("/owner")
    with caplog.at_level(logging.ERROR, logger="omni_actors"):
        task = scope.create_task(fail(), name="failing")
        await asyncio.gather(task, return_exceptions=True)
    (record,) = [r for r in caplog.records if "failing" in r.getMessage()]
    assert "/owner" in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[1] is task.exception()
