"""Every control-plane message crosses a process boundary intact, refs inside included."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest
import torch

from omni_actors._ref import ActorRef
from omni_actors.protocols import control
from omni_actors.protocols.control import (
    Abort,
    AbortSession,
    Cancel,
    CancelResponse,
    Deadlines,
    Health,
    Inspect,
    LinkCounts,
    ListSessions,
    ListStages,
    OpenSession,
    PipelineHealth,
    Prewarm,
    RebuildSession,
    Refused,
    ReopenSession,
    SessionMessage,
    StageFailed,
    StageHealth,
    StageMessage,
    StageState,
    StepCounts,
    StreamCredit,
    Target,
    Truncate,
    Truncated,
    TruncateResponse,
)
from omni_actors.protocols.message import ControlMessage
from omni_actors.protocols.message import ControlMessage as SignalsControlMessage
from omni_actors.protocols.stage import Chunk, SessionKey, StageMetrics, StageReport
from omni_actors.protocols.wire import RefDesc
from omni_actors.testing import ActorTestKit
from omni_actors.transport.codec import Decoder, Encoder

KEY = SessionKey("caller-7#3")
DEADLINES = Deadlines(first_chunk_s=1.0, inter_chunk_s=2.0, idle_s=3.0, total_s=4.0)


def _examples(owner: ActorRef[Any], downstream: ActorRef[Any]) -> list[msgspec.Struct]:
    """One instance of every struct of ``protocols.control``, plus the data plane's."""
    target = Target(
        stage="talker",
        ref=downstream,
        mode="full",
        fields=("hidden", "text"),
        window=(4, 6, 3, (5,)),
        accumulate={"hidden": "concat", "speaker": "replace"},
    )
    health = StageHealth(stage="talker", state="restarting", restarts=2, sessions=1)
    steps = StepCounts(
        steps=12,
        decode_rows=40,
        prefill_tokens=2505,
        prefill_steps=1,
        step_s=0.4,
        prefill_step_s=0.1,
        prefill_works=1,
        prefill_wait_s=0.002,
        decode_wait_s=0.05,
    )
    links = LinkCounts(placed=30, host=2, unmarked=1)
    running = StageHealth(
        stage="thinker",
        state="running",
        restarts=0,
        sessions=1,
        queued=4,
        steps=steps,
        links=links,
    )
    return [
        DEADLINES,
        steps,
        links,
        target,
        Prewarm(
            key=KEY,
            owner=owner,
            sources=("input",),
            targets=(target,),
            emit=("text",),
            resumable=True,
            deadlines=DEADLINES,
            window=8,
            segment=3,
        ),
        Abort(key=KEY, reason="barge-in"),
        Cancel(key=KEY, segment=2),
        CancelResponse(segment=2),
        Truncate(key=KEY, kept=17),
        TruncateResponse(audio_ms=1250.0),
        Truncated(kept=3, text="Hello, wor"),
        Refused(reason="cannot truncate"),
        Inspect(),
        StageState(stage="talker", keys=[KEY], queued=3, steps=steps),
        OpenSession(),
        AbortSession(reason="disconnected"),
        StageFailed(stage="talker", error="WorkerDiedError: killed", at=12.5),
        ReopenSession(timeout_s=30.0),
        RebuildSession(reason="turn t1 was deleted"),
        ListSessions(),
        ListStages(),
        Health(),
        health,
        PipelineHealth(stages={"talker": health, "thinker": running}),
        StreamCredit(key=KEY, source="code2wav", receiver="client", n=32),
        Chunk(key=KEY, source="thinker", seq=2, tensors={"hidden": torch.ones(2, 3)}),
        StageReport(
            key=KEY,
            stage="code2wav",
            segment=1,
            end="error",
            metrics=StageMetrics(outputs=3),
            code="chunk_gap",
            error_type="omni_actors.actors.stage.accumulate:ChunkGapError",
            error="chunks were lost",
            reply=(72, 105),
        ),
    ]


def _codec(refs: dict[str, ActorRef[Any]]) -> tuple[Encoder, Any]:
    """A codec whose refs resolve as a node's do: by path, to the actor's ref."""
    encoder = Encoder(ref_hook=lambda ref: RefDesc(node=1, endpoint="ipc://test", path=ref.path))
    return encoder, lambda type_: Decoder(type_, ref_hook=lambda desc: refs[desc.path])


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, msgspec.Struct):
        return type(a) is type(b) and all(
            _equal(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return bool(a == b)


async def test_every_control_message_round_trips_through_the_codec() -> None:
    async with ActorTestKit() as kit:
        owner, downstream = await kit.create_probe(), await kit.create_probe()
        refs = {owner.ref.path: owner.ref, downstream.ref.path: downstream.ref}
        examples = _examples(owner.ref, downstream.ref)
        declared = {
            cls
            for cls in vars(control).values()
            if isinstance(cls, type)
            and issubclass(cls, msgspec.Struct)
            and cls.__module__ == control.__name__
        }
        assert declared <= {type(m) for m in examples}, "add an example of the new message"
        encoder, decoder = _codec(refs)
        for message in examples:
            frames = encoder.encode(message)
            back = decoder(type(message)).decode(frames[0], frames[1:])
            assert _equal(back, message), (back, message)


async def test_refs_inside_a_prewarm_arrive_as_working_refs() -> None:
    async with ActorTestKit() as kit:
        owner, downstream = await kit.create_probe(), await kit.create_probe()
        refs = {owner.ref.path: owner.ref, downstream.ref.path: downstream.ref}
        encoder, decoder = _codec(refs)
        prewarm = next(m for m in _examples(owner.ref, downstream.ref) if isinstance(m, Prewarm))
        frames = encoder.encode(prewarm)
        # Decoded against the stage's whole union, as a node decodes for a stage actor.
        back = decoder(StageMessage).decode(frames[0], frames[1:])
        assert isinstance(back, Prewarm)
        assert back.owner is owner.ref
        assert back.targets[0].ref is downstream.ref
        await back.targets[0].ref.tell(Chunk(key=KEY, source="thinker", seq=0))
        assert (await downstream.expect_message(Chunk)).key == KEY


def test_each_actor_union_decodes_by_tag_and_control_messages_overtake() -> None:
    for union in (StageMessage, SessionMessage):
        members = typing.get_args(union)
        tags = [m.__struct_config__.tag for m in members]
        assert all(tags), tags
        assert len(set(tags)) == len(tags), tags
        Decoder(union)  # msgspec refuses a union it cannot tell apart
    urgent = {Abort, AbortSession, StageFailed, StreamCredit}
    for cls in (
        Prewarm,
        Abort,
        Inspect,
        OpenSession,
        AbortSession,
        StageFailed,
        StreamCredit,
        Chunk,
    ):
        assert issubclass(cls, ControlMessage) == (cls in urgent), cls
    assert SignalsControlMessage is ControlMessage


def test_a_report_with_a_code_outside_the_vocabulary_is_refused() -> None:
    report = msgspec.msgpack.encode(
        {
            "type": "stage-report",
            "key": KEY,
            "stage": "talker",
            "segment": 0,
            "end": "error",
            "metrics": {},
            "code": "my-own-code",
        }
    )
    with pytest.raises(msgspec.ValidationError, match="code"):
        msgspec.msgpack.decode(report, type=StageReport)
