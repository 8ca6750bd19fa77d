"""A stage's aborts: never awaited in ``receive``, each engine abort exactly once, and
no session task outlives the stage."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import torch

from omni_actors.actors.engines.scripted import ScriptedArgs, ScriptedEngine
from omni_actors.actors.stage.actor import StageActor
from omni_actors.protocols.control import Abort, Deadlines, Inspect, Prewarm
from omni_actors.protocols.stage import INPUT, Chunk, SessionKey, StageReport
from omni_actors.testing import ActorTestKit, TestProbe

DEADLINES = Deadlines(first_chunk_s=5, inter_chunk_s=5, idle_s=5, total_s=10)
TALKER = {"outputs_per_input": 2, "fields": ["codes", "text"]}


class GatedAbortEngine(ScriptedEngine):
    """A scripted engine whose ``abort`` counts its calls and then waits for ``gate``:
    an engine that is slow to free a session, with no time involved."""

    def __init__(self, gate: asyncio.Event, aborts: list[str], **args: Any) -> None:
        super().__init__(ScriptedArgs(**args))
        self.gate = gate
        self.aborts = aborts

    async def abort(self, session: str) -> None:
        self.aborts.append(session)
        await super().abort(session)  # its generate ends at once...
        await self.gate.wait()  # ...but freeing the session takes until the test says


class GatedStage(StageActor):
    """A stage hosting a :class:`GatedAbortEngine` the test controls."""

    def __init__(self, gate: asyncio.Event, aborts: list[str]) -> None:
        super().__init__("talker", "scripted", TALKER)
        self.gate = gate
        self.abort_calls = aborts

    async def on_start(self) -> None:
        engine = GatedAbortEngine(self.gate, self.abort_calls, **TALKER)
        await engine.start()
        self.engine = engine


def prewarm(owner: TestProbe, session: str) -> Prewarm:
    return Prewarm(
        key=SessionKey(session),
        owner=owner.ref,
        sources=(INPUT,),
        emit=("text",),
        deadlines=DEADLINES,
    )


def chunk(session: str, seq: int, end: str = "") -> Chunk:
    return Chunk(
        key=SessionKey(session),
        source=INPUT,
        seq=seq,
        tensors={"hidden": torch.zeros(1, 4)},
        end=end,  # type: ignore[arg-type]
    )


async def test_a_slow_abort_does_not_hold_up_another_session_on_the_stage() -> None:
    gate, aborts = asyncio.Event(), []
    async with ActorTestKit() as kit:
        try:
            stage = await kit.spawn(GatedStage, gate, aborts)
            streaming, aborted = await kit.create_probe(), await kit.create_probe()
            assert await stage.ask(prewarm(streaming, "a")) is True
            assert await stage.ask(prewarm(aborted, "b")) is True
            await stage.tell(chunk("a", 0))
            assert (await streaming.expect_message(Chunk)).texts["text"] == "t0 "
            await stage.tell(chunk("b", 0))
            await aborted.expect_message(Chunk)

            await stage.tell(
                Abort(key=SessionKey("b"), reason="barge-in")
            )  # its engine abort now hangs on gate
            await kit.eventually(lambda: aborts == ["b"], what="the engine's abort began")

            # Session a keeps streaming and finishes while b's abort is still pending.
            await streaming.expect_message(Chunk)  # t1, from the first input
            for seq in (1, 2):
                await stage.tell(chunk("a", seq, end="finished" if seq == 2 else ""))
                for _ in range(2):
                    await streaming.expect_message(Chunk)
            report = await streaming.expect_message(StageReport)
            assert report.end == "finished"
            assert not gate.is_set()
            # The aborted session is still held until its engine has freed it.
            assert (await stage.ask(Inspect())).keys == ["b"]
        finally:
            gate.set()
        await kit.eventually(_held_nothing(stage), what="b freed")
        assert aborts == ["b"]  # once


def _held_nothing(stage: Any) -> Any:
    async def check() -> bool:
        return (await stage.ask(Inspect())).keys == []

    return check


class CountingEngine(ScriptedEngine):
    """A scripted engine that counts ``abort`` and ``release`` per session."""

    def __init__(self, calls: list[tuple[str, str]], **args: Any) -> None:
        super().__init__(ScriptedArgs(**args))
        self.calls = calls

    async def abort(self, session: str) -> None:
        self.calls.append(("abort", session))
        await super().abort(session)

    async def release(self, session: str) -> None:
        self.calls.append(("release", session))


class CountingStage(StageActor):
    def __init__(self, calls: list[tuple[str, str]], args: dict[str, Any]) -> None:
        super().__init__("talker", "scripted", args)
        self.calls = calls

    async def on_start(self) -> None:
        engine = CountingEngine(self.calls, **self.args)
        await engine.start()
        self.engine = engine


async def test_each_session_is_aborted_on_the_engine_exactly_once() -> None:
    calls: list[tuple[str, str]] = []
    # Slow outputs, so that both sessions are mid-generate when they end.
    args = {**TALKER, "first_output_s": 0.0, "per_output_s": 30.0}
    async with ActorTestKit() as kit:
        stage = await kit.spawn(CountingStage, calls, args)
        owner = await kit.create_probe()
        for session in ("aborted", "stopped", "done"):
            assert await stage.ask(prewarm(owner, session)) is True
        for session in ("aborted", "stopped"):
            await stage.tell(chunk(session, 0))
        await owner.receive_messages(2)  # each one's first output: both are generating
        await stage.ask(Abort(key=SessionKey("aborted")))
        await kit.eventually(_held_only(stage, ["done", "stopped"]), what="aborted freed")
        await stage.tell(chunk("done", 0, end="finished"))
        # done's two outputs (the second is 30 s away): abort it by stopping the stage.
        await owner.expect_message(Chunk)
        await kit.system.stop(stage)
    assert sorted(calls) == [("abort", "aborted"), ("abort", "done"), ("abort", "stopped")]


def _held_only(stage: Any, sessions: list[str]) -> Any:
    async def check() -> bool:
        return (await stage.ask(Inspect())).keys == sessions

    return check


async def test_a_finished_session_is_released_not_aborted() -> None:
    calls: list[tuple[str, str]] = []
    async with ActorTestKit() as kit:
        stage = await kit.spawn(CountingStage, calls, TALKER)
        owner = await kit.create_probe()
        await stage.ask(prewarm(owner, "s"))
        await stage.tell(chunk("s", 0, end="finished"))
        await owner.receive_messages(2)
        assert (await owner.expect_message(StageReport)).end == "finished"
        await stage.ask(Abort(key=SessionKey("s")))  # after the end: nothing left to abort
        await kit.eventually(_held_nothing(stage))
    assert calls == [("release", "s")]


class StuckEngine(ScriptedEngine):
    """Its ``abort`` ignores cancellation until ``gate`` is set: a broken engine."""

    def __init__(self, gate: asyncio.Event, **args: Any) -> None:
        super().__init__(ScriptedArgs(**args))
        self.gate = gate

    async def abort(self, session: str) -> None:
        await super().abort(session)
        while not self.gate.is_set():
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                continue


class StuckStage(StageActor):
    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__("talker", "scripted", TALKER)
        self.gate = gate

    async def on_start(self) -> None:
        engine = StuckEngine(self.gate, **TALKER)
        await engine.start()
        self.engine = engine


async def test_a_session_task_that_will_not_end_is_logged_as_abandoned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Event()
    async with ActorTestKit(stop_timeout=0.2) as kit:
        stage = await kit.spawn(StuckStage, gate)
        owner = await kit.create_probe()
        await stage.ask(prewarm(owner, "s"))
        await stage.tell(chunk("s", 0))
        await owner.expect_message(Chunk)
        try:
            with caplog.at_level(logging.ERROR, logger="omni_actors"):
                await kit.system.stop(stage)
            logged = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
            assert logged, caplog.text
            assert "talker session s" in logged[0]
            assert "stage talker stopping" in logged[0]
            # Still owned: the system knows it, so its shutdown still awaits it.
            (task,) = [t for t in kit.live_tasks() if t.get_name() == "talker session s"]
        finally:
            gate.set()  # the engine lets go: the abandoned task ends, nothing leaks
        await kit.eventually(task.done)
