"""``StageActor`` on its own, driven through a ``TestProbe`` as the session's owner."""

from __future__ import annotations

import msgspec
import torch

from omni_actors.actors.stage.actor import StageActor
from omni_actors.protocols.control import Abort, Deadlines, Inspect, Prewarm, StageState, Target
from omni_actors.protocols.stage import INPUT, Chunk, SessionKey, StageReport
from omni_actors.testing import ActorTestKit, TestProbe

DEADLINES = Deadlines(first_chunk_s=5, inter_chunk_s=5, idle_s=5, total_s=10)
TALKER = {"outputs_per_input": 2, "fields": ["codes"]}


S = SessionKey("s")


def prewarm(owner: TestProbe, key: SessionKey = S, **kw: object) -> Prewarm:
    return Prewarm(
        key=key,
        owner=owner.ref,
        sources=(INPUT,),
        deadlines=DEADLINES,
        **kw,  # type: ignore[arg-type]
    )


def chunk(seq: int, rows: int = 1, end: str = "", source: str = INPUT) -> Chunk:
    return Chunk(
        key=S,
        source=source,
        seq=seq,
        tensors={"hidden": torch.zeros(rows, 4)} if rows else {},
        end=end,  # type: ignore[arg-type]
    )


async def test_outputs_stream_to_the_owner_then_a_report() -> None:
    async with ActorTestKit() as kit:
        owner = await kit.create_probe()
        stage = await kit.spawn(
            StageActor, "talker", "scripted", {**TALKER, "fields": ["codes", "text"]}
        )
        assert await stage.ask(prewarm(owner, emit=("text",))) is True
        await stage.tell(chunk(0, rows=2))
        await stage.tell(chunk(1, rows=0, end="finished"))
        texts = [await owner.expect_message(Chunk) for _ in range(4)]
        assert [c.texts["text"] for c in texts] == ["t0 ", "t1 ", "t2 ", "t3 "]
        assert [c.seq for c in texts] == [0, 1, 2, 3]
        report = await owner.expect_message(StageReport)
        assert report.end == "finished"
        assert report.metrics.outputs == 4
        assert report.metrics.chunks_in == 2
        assert await stage.ask(Inspect()) == StageState(stage="talker", keys=[])


async def test_a_windowed_target_gets_frames_with_left_context() -> None:
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        stage = await kit.spawn(StageActor, "talker", "scripted", TALKER)
        target = Target(
            stage="code2wav", ref=down.ref, mode="stream", fields=("codes",), window=(2, 3, 1, ())
        )
        await stage.ask(prewarm(owner, targets=(target,)))
        await stage.tell(chunk(0, rows=3, end="finished"))  # 6 frames: 2 + 3 + 1
        got = [await down.expect_message(Chunk) for _ in range(3)]
        assert [c.tensors["codes"].shape[0] for c in got] == [2, 4, 2]
        assert [c.context for c in got] == [0, 1, 1]
        assert [c.end for c in got] == ["", "", "finished"]
        assert (await owner.expect_message(StageReport)).end == "finished"


async def test_an_aborted_session_is_never_allocated_by_a_late_prewarm() -> None:
    async with ActorTestKit() as kit:
        owner = await kit.create_probe()
        stage = await kit.spawn(StageActor, "talker", "scripted", TALKER)
        assert await stage.ask(Abort(key=S, reason="cancelled")) is True
        assert await stage.ask(prewarm(owner)) is False
        assert await stage.ask(Inspect()) == StageState(stage="talker", keys=[])


async def test_a_duplicate_prewarm_is_refused_without_crashing_the_stage() -> None:
    async with ActorTestKit() as kit:
        owner = await kit.create_probe()
        stage = await kit.spawn(StageActor, "talker", "scripted", TALKER)
        assert await stage.ask(prewarm(owner)) is True
        assert await stage.ask(prewarm(owner)) is False
        assert stage.is_alive
        assert (await stage.ask(Inspect())).keys == ["s"]
        await stage.ask(Abort(key=S))
        assert (await stage.ask(Inspect())).keys == []


async def test_a_chunk_from_a_stream_off_the_path_fails_the_session() -> None:
    async with ActorTestKit() as kit:
        owner = await kit.create_probe()
        stage = await kit.spawn(StageActor, "talker", "scripted", TALKER)
        await stage.ask(prewarm(owner))
        await stage.tell(chunk(0, source="intruder"))
        report = await owner.expect_message(StageReport)
        assert report.end == "error"
        assert "intruder" in report.error
        assert "ProtocolError" in report.error_type
        assert report.code == "internal"
        assert (await stage.ask(Inspect())).keys == []


async def test_a_report_says_where_its_failure_came_from() -> None:
    """The stage tells its failures apart where it sees them (``StageReport.failure``):
    the engine raised, a stage it streams to is gone, or chunks were lost."""
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        failing = await kit.spawn(StageActor, "talker", "scripted", {**TALKER, "fail_after": 1})
        await failing.ask(prewarm(owner))
        await failing.tell(chunk(0, end="finished"))
        report = await owner.expect_message(StageReport)
        assert (report.end, report.failure, report.code) == ("error", "engine", "engine_error")

        stage = await kit.spawn(StageActor, "talker2", "scripted", TALKER)
        target = Target(stage="code2wav", ref=down.ref, mode="stream", fields=("codes",))
        await stage.ask(prewarm(owner, targets=(target,)))
        await kit.system.stop(down.ref)
        await stage.tell(chunk(0, end="finished"))
        report = await owner.expect_message(StageReport)
        assert (report.end, report.failure) == ("error", "peer_gone"), report
        assert "ActorStoppedError" in report.error_type

        await stage.ask(prewarm(owner, key=SessionKey("gap")))
        await stage.tell(msgspec.structs.replace(chunk(0), key=SessionKey("gap")))
        await stage.tell(msgspec.structs.replace(chunk(2), key=SessionKey("gap")))
        report = await owner.expect_message(StageReport)
        assert (report.end, report.failure, report.code) == ("error", "chunk_gap", "chunk_gap")


async def test_an_engine_failure_in_a_conversation_fails_the_response_as_the_engines() -> None:
    async with ActorTestKit() as kit:
        owner = await kit.create_probe()
        stage = await kit.spawn(StageActor, "talker", "scripted", {**TALKER, "fail_after": 1})
        await stage.ask(prewarm(owner, resumable=True))
        await stage.tell(chunk(0, end="segment"))
        failed = await owner.expect_message(StageReport)
        assert (failed.end, failed.failure, failed.code) == ("failed", "engine", "engine_error")
        ended = await owner.expect_message(StageReport)
        assert (ended.end, ended.failure) == ("segment", None)


async def test_a_bad_engine_fails_the_spawn_with_a_clear_error() -> None:
    import pytest

    from omni_actors.actors.engines.registry import EngineArgsError, EngineUnavailableError

    async with ActorTestKit() as kit:
        with pytest.raises(EngineArgsError, match=r"engine\.args\.model: Field required"):
            await kit.spawn(StageActor, "thinker", "vllm", {})
        with pytest.raises(EngineUnavailableError, match="unknown engine kind 'onnx'"):
            await kit.spawn(StageActor, "thinker", "onnx", {})
        with pytest.raises(
            EngineArgsError, match=r"stages\[thinker\]\.engine\.args\.no_such_arg: Extra inputs"
        ):
            await kit.spawn(StageActor, "thinker", "scripted", {"no_such_arg": 1})
