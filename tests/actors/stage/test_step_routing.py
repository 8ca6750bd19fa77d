"""One turn's chunks of many sessions to one receiving stage, as one message.

A stage's sessions that produce outputs in the same turn of its event loop (one engine
step) reach each receiving stage as one ``StepChunks``; every chunk keeps its session,
sequence number and credit. Packing puts a field's rows of every member in one tensor,
and the receiver slices them back out as views. A session aborted before its turn ends
sends nothing; one aborted on the receiver gets none of the step's rows; a session out of
credits holds up its own stream only; a receiver that is gone fails every session that
sent to it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
import torch

from omni_actors._task_scope import TaskScope
from omni_actors.actors.stage.actor import StageActor
from omni_actors.actors.stage.steps import StepRouter, pack, unpack
from omni_actors.errors import ProtocolError
from omni_actors.protocols.control import (
    Abort,
    Deadlines,
    Inspect,
    Prewarm,
    StreamCredit,
    Target,
)
from omni_actors.protocols.stage import INPUT, Chunk, SessionKey, StageReport, StepChunks
from omni_actors.testing import ActorTestKit, TestProbe, eventually

DEADLINES = Deadlines(first_chunk_s=5, inter_chunk_s=5, idle_s=5, total_s=10)
# One codec frame per input row, at once: a step of the stage is one frame per session.
TALKER = {"outputs_per_input": 1, "fields": ["codes"]}
KEYS = [SessionKey(f"s{i}#1") for i in range(4)]


def member(key: SessionKey, seq: int, **tensors: torch.Tensor) -> Chunk:
    return Chunk(key=key, source="talker", seq=seq, tensors=tensors, texts={"text": f"{key}"})


def test_a_packed_step_unpacks_to_its_chunks_as_views() -> None:
    chunks = [
        member(KEYS[0], 3, codes=torch.arange(8).reshape(2, 4), hidden=torch.ones(1, 3)),
        member(KEYS[1], 0, codes=torch.arange(4).reshape(1, 4)),  # no hidden
        member(KEYS[2], 7, codes=torch.arange(12).reshape(3, 4), hidden=torch.zeros(2, 5)),
        Chunk(key=KEYS[3], source="talker", seq=1, end="finished"),  # an end marker
    ]
    step = pack(chunks)
    # codes share dtype and trailing shape: one tensor; hidden's rows differ in width.
    assert set(step.packed) == {"codes"}
    assert step.rows == {"codes": (2, 1, 3, -1)}
    assert torch.equal(step.packed["codes"], torch.cat([c.tensors["codes"] for c in chunks[:3]]))
    assert all("codes" not in c.tensors for c in step.chunks)
    got = unpack(step)
    assert [(c.key, c.seq, c.end, c.texts) for c in got] == [
        (c.key, c.seq, c.end, c.texts) for c in chunks
    ]
    for sent, came in zip(chunks, got, strict=True):
        assert sent.tensors.keys() == came.tensors.keys()
        for name, tensor in sent.tensors.items():
            assert torch.equal(came.tensors[name], tensor)
    base = step.packed["codes"].untyped_storage().data_ptr()
    assert all(c.tensors["codes"].untyped_storage().data_ptr() == base for c in got[:3])


def test_a_lone_field_and_scalars_stay_with_their_chunk() -> None:
    chunks = [
        member(KEYS[0], 0, codes=torch.ones(1, 4), kept=torch.tensor(3)),
        member(KEYS[1], 0, kept=torch.tensor(4)),
    ]
    step = pack(chunks)
    assert step.packed == {}
    assert step.chunks == tuple(chunks)
    assert unpack(step) == chunks


@pytest.mark.parametrize(
    ("packed", "rows", "message"),
    [
        ({"codes": torch.ones(3, 4)}, {"codes": (1, 1)}, "has 3 rows"),
        ({"codes": torch.ones(3, 4)}, {"codes": (1, 1, 1)}, "counts 3 members"),
        ({"codes": torch.ones(2, 4)}, {"codes": (3, -1)}, "has 2 rows"),
        ({"codes": torch.ones(2, 4)}, {"codes": (4, -2)}, "claim"),
        ({"codes": torch.ones(2, 4)}, {}, "pack"),
        ({}, {"codes": (1, 1)}, "pack"),
        ({"codes": torch.tensor(1)}, {"codes": (0, 0)}, "shape"),
    ],
)
def test_a_step_whose_rows_disagree_is_refused(
    packed: dict[str, torch.Tensor], rows: dict[str, tuple[int, ...]], message: str
) -> None:
    step = StepChunks(chunks=(member(KEYS[0], 0), member(KEYS[1], 0)), packed=packed, rows=rows)
    with pytest.raises(ProtocolError, match=message):
        unpack(step)


# -- a stage's sessions, one step -------------------------------------------------------


def prewarm(owner: TestProbe, key: SessionKey, *targets: Target, window: int = 64) -> Prewarm:
    return Prewarm(
        key=key,
        owner=owner.ref,
        sources=(INPUT,),
        targets=targets,
        deadlines=DEADLINES,
        window=window,
    )


def to(down: Any, *, steps: bool = True) -> Target:
    return Target(stage="code2wav", ref=down, mode="stream", fields=("codes",), steps=steps)


def inputs(keys: list[SessionKey], seq: int, end: str = "") -> StepChunks:
    """One input chunk (one row) for each session, as one step (one message)."""
    return StepChunks(
        chunks=tuple(
            Chunk(
                key=k,
                source=INPUT,
                seq=seq,
                tensors={"hidden": torch.full((1, 4), float(seq))},
                end=end,  # type: ignore[arg-type]
            )
            for k in keys
        )
    )


async def messages(probe: TestProbe, kind: type[Any], count: int) -> list[Any]:
    """The next ``count`` messages of ``kind`` the probe gets (credits skipped)."""
    got: list[Any] = []
    while len(got) < count:
        message = await probe.expect_message(object)
        if isinstance(message, kind):
            got.append(message)
        else:
            assert isinstance(message, StreamCredit | StageReport), message
    return got


def chunks_of(received: list[Any]) -> list[Chunk]:
    out: list[Chunk] = []
    for message in received:
        out.extend(unpack(message) if isinstance(message, StepChunks) else [message])
    return out


async def talker(kit: ActorTestKit, owner: TestProbe, *targets: Target, window: int = 64) -> Any:
    stage = await kit.spawn(StageActor, "talker", "scripted", TALKER)
    for key in KEYS:
        assert await stage.ask(prewarm(owner, key, *targets, window=window)) is True
    return stage


async def test_one_step_of_several_sessions_reaches_a_stage_as_one_message() -> None:
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        stage = await talker(kit, owner, to(down.ref))
        await stage.tell(inputs(KEYS, 0))
        step = await down.expect_message(StepChunks)
        assert [(c.key, c.seq) for c in step.chunks] == [(k, 0) for k in KEYS]
        assert all(c.tensors["codes"].shape == (1, 4) for c in step.chunks)
        await down.expect_no_message(0.05)
        # The next step: the same sessions, the next sequence number, one message again.
        await stage.tell(inputs(KEYS, 1, end="finished"))
        got = chunks_of(await messages(down, StepChunks | Chunk, 1))
        while sum(1 for c in got if c.end) < len(KEYS):
            got += chunks_of(await messages(down, StepChunks | Chunk, 1))
        for key in KEYS:
            mine = [c for c in got if c.key == key]
            assert [c.seq for c in mine] == [1, 2]  # a frame, then the end marker
            assert [c.end for c in mine] == ["", "finished"]
        reports = await messages(owner, StageReport, len(KEYS))
        assert sorted(r.key for r in reports) == KEYS
        assert {r.end for r in reports} == {"finished"}


async def test_a_target_that_takes_no_steps_gets_each_chunk_alone() -> None:
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        stage = await talker(kit, owner, to(down.ref, steps=False))
        await stage.tell(inputs(KEYS, 0))
        got = [await down.expect_message(Chunk) for _ in KEYS]
        assert sorted(c.key for c in got) == KEYS


async def test_a_session_aborted_on_the_receiver_gets_none_of_the_step() -> None:
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        stage = await talker(kit, owner, to(down.ref))
        assert await stage.ask(Abort(key=KEYS[1])) is True
        await stage.tell(pack(list(inputs(KEYS, 0).chunks)))  # packed, as off the wire
        step = await down.expect_message(StepChunks)
        assert [c.key for c in step.chunks] == [KEYS[0], KEYS[2], KEYS[3]]
        await eventually(
            lambda: KEYS[1] not in stage_sessions(kit, stage), what="the aborted session gone"
        )
        assert KEYS[1] not in (await stage.ask(Inspect())).keys


def stage_sessions(kit: ActorTestKit, stage: Any) -> set[SessionKey]:
    from omni_actors.testing.inspection import actor_instance

    instance = actor_instance(stage)
    assert isinstance(instance, StageActor)
    return {*instance.sessions, *instance.closing}


async def test_a_session_aborted_before_its_turn_ends_sends_nothing() -> None:
    class Sender:
        def __init__(self) -> None:
            self.closed = False
            self.copy_wait = 0.0
            self.failed: BaseException | None = None

        def fail(self, error: BaseException) -> None:
            self.failed = error

    async with ActorTestKit() as kit:
        down = await kit.create_probe()
        tasks = TaskScope("test")
        router = StepRouter(tasks)
        route = router.route(down.ref)
        senders = [Sender() for _ in KEYS]
        for key, sender in zip(KEYS, senders, strict=True):
            route.add(sender, member(key, 0, codes=torch.ones(1, 4)))
        senders[2].closed = True  # its session was aborted within the turn
        step = await down.expect_message(StepChunks)
        assert [c.key for c in step.chunks] == [KEYS[0], KEYS[1], KEYS[3]]
        assert route.messages == 1
        assert route.settled() is None
        await tasks.cancel(1.0, "test over")


async def test_a_session_out_of_credits_holds_up_its_own_stream_only() -> None:
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        stage = await talker(kit, owner, to(down.ref), window=2)
        slow, fast = KEYS[0], KEYS[1:]
        frames = 6
        step = StepChunks(
            chunks=tuple(
                Chunk(key=k, source=INPUT, seq=0, tensors={"hidden": torch.zeros(frames, 4)})
                for k in KEYS
            )
        )
        await stage.tell(step)
        got: list[Chunk] = []
        # Grant every session but ``slow`` a credit for each frame it sends.
        while sum(1 for c in got if c.key != slow) < frames * len(fast):
            came = chunks_of(await messages(down, StepChunks | Chunk, 1))
            got += came
            for c in came:
                if c.key != slow:
                    await stage.tell(
                        StreamCredit(key=c.key, source="talker", receiver="code2wav", n=1)
                    )
        for key in fast:
            assert [c.seq for c in got if c.key == key] == list(range(frames))
        # ``slow`` sent its window and waits for a credit; nothing else held it up.
        assert [c.seq for c in got if c.key == slow] == [0, 1]
        await down.expect_no_message(0.05)
        await stage.tell(StreamCredit(key=slow, source="talker", receiver="code2wav", n=4))
        rest = chunks_of(await messages(down, StepChunks | Chunk, 1))
        while len(rest) < frames - 2:
            rest += chunks_of(await messages(down, StepChunks | Chunk, 1))
        assert [c.seq for c in rest] == list(range(2, frames))


async def test_a_receiver_gone_fails_every_session_that_sent_to_it() -> None:
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        stage = await talker(kit, owner, to(down.ref))
        await kit.system.stop(down.ref)
        await stage.tell(inputs(KEYS, 0, end="finished"))
        reports = await messages(owner, StageReport, len(KEYS))
        assert sorted(r.key for r in reports) == KEYS
        for report in reports:
            assert (report.end, report.failure) == ("error", "peer_gone"), report
            assert "ActorStoppedError" in report.error_type
        await eventually(lambda: not stage_sessions(kit, stage), what="every session freed")


async def test_a_step_with_rows_that_disagree_fails_its_sessions_not_the_stage() -> None:
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        stage = await talker(kit, owner, to(down.ref))
        good = pack(list(inputs(KEYS[:2], 0).chunks))
        bad = msgspec.structs.replace(good, rows={"hidden": (1, 2)})
        await stage.tell(bad)
        reports = await messages(owner, StageReport, 2)
        assert sorted(r.key for r in reports) == KEYS[:2]
        assert all(r.end == "error" and "ProtocolError" in r.error_type for r in reports)
        assert stage.is_alive
        await stage.tell(inputs(KEYS[2:], 0))
        step = await down.expect_message(StepChunks)
        assert [c.key for c in step.chunks] == KEYS[2:]


async def test_the_session_tasks_of_one_step_wake_in_one_turn() -> None:
    """What the routing relies on: futures a step loop resolves in one step wake their
    tasks in one turn, before a callback scheduled from the first of them runs."""
    loop = asyncio.get_running_loop()
    order: list[str] = []
    futures = [loop.create_future() for _ in range(3)]

    async def session(i: int) -> None:
        await futures[i]
        order.append(f"s{i}")
        if i == 0:
            loop.call_soon(order.append, "flush")

    tasks = [asyncio.ensure_future(session(i)) for i in range(3)]
    await asyncio.sleep(0)
    for future in futures:
        future.set_result(None)
    await asyncio.gather(*tasks)
    await asyncio.sleep(0)
    assert order == ["s0", "s1", "s2", "flush"]
