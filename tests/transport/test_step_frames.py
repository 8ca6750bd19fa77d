"""A step of several sessions crosses to a stage in another process in one frame, each
tensor field in one buffer, and, from a GPU, with one device-to-host copy per field:
counted at the link's socket and at the stage's copies, against the same chunks sent one
by one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from node_pair import node_pair
from test_link_batches import Counting

from omni_actors import Actor, ActorRef
from omni_actors._task_scope import TaskScope
from omni_actors.actors.stage.steps import StepRouter, pack, unpack
from omni_actors.protocols import wire
from omni_actors.protocols.stage import Chunk, SessionKey, StepChunks
from omni_actors.testing import eventually

B = 8
ROWS = 64 * 1024 // 16  # 64 KiB of float32 rows of 4 per session: out of band, not inline


class StageInbox(Actor[Chunk | StepChunks]):
    """Takes what a stage takes, and hands it to a probe."""

    def __init__(self, probe: ActorRef[object]) -> None:
        self.probe = probe

    async def receive(self, message: Chunk | StepChunks) -> None:
        await self.probe.tell(message)


class Sender:
    closed = False
    copy_wait = 0.0
    failed: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        self.failed = error


class HostCopies:
    """A GPU stage's transfers as the router uses them, counting the copies (``meta``
    tensors stand for device ones: no CUDA here)."""

    def __init__(self) -> None:
        self.copies = 0
        self.concats = 0

    def concat(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        self.concats += 1  # on a GPU: on the copy stream, after the parts' step
        return torch.cat(list(parts))

    async def to_host(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in fields.items():
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                self.copies += 1
                value = torch.full(value.shape, 7.0, dtype=value.dtype)
            out[name] = value
        return out


def chunks(device: str = "cpu") -> list[Chunk]:
    return [
        Chunk(
            key=SessionKey(f"s{i}#1"),
            source="talker",
            seq=i,
            tensors={"codes": torch.full((ROWS, 4), float(i), device=device)},
        )
        for i in range(B)
    ]


async def test_a_step_of_b_sessions_is_one_frame_not_b() -> None:
    async with node_pair() as (kit, receiver, sender):
        probe = await kit.create_probe()
        inbox = await kit.spawn(StageInbox, probe.ref)
        ref = sender.decode_ref(wire.RefDesc(receiver.node_id, receiver.endpoint, inbox.path))
        # One round trip first, so the flow's set-up frames are out before counting.
        await ref.tell(Chunk(key=SessionKey("warm#1"), source="talker", seq=0))
        await probe.expect_message(Chunk)
        await eventually(
            lambda: sender.slabs.attached(receiver.node_id), what="the receiver's slab attached"
        )
        link = sender.connect(receiver.node_id, receiver.endpoint)
        counting = Counting(link.socket)
        link.socket = counting  # type: ignore[assignment]

        # The chunks one by one, as outlets sent them before: a frame each.
        for chunk in chunks():
            assert ref.try_tell(chunk)
        for _ in range(B):
            await probe.expect_message(Chunk)
        alone = counting.frames

        tasks = TaskScope("test")
        router = StepRouter(tasks)
        route = router.route(ref)
        sent = chunks()
        for chunk in sent:  # one turn: every session of the step hands its chunk over
            route.add(Sender(), chunk)
        step = await probe.expect_message(StepChunks)
        assert (alone, counting.frames - alone) == (B, 1)
        assert route.messages == 1
        assert list(step.packed) == ["codes"]
        assert step.packed["codes"].shape == (B * ROWS, 4)
        got = unpack(step)
        assert [(c.key, c.seq) for c in got] == [(c.key, c.seq) for c in sent]
        for came, chunk in zip(got, sent, strict=True):
            assert torch.equal(came.tensors["codes"], chunk.tensors["codes"])
        await tasks.cancel(1.0, "test over")


async def test_a_gpu_step_is_copied_to_the_host_once_per_field() -> None:
    async with node_pair() as (kit, receiver, sender):
        probe = await kit.create_probe()
        inbox = await kit.spawn(StageInbox, probe.ref)
        ref = sender.decode_ref(wire.RefDesc(receiver.node_id, receiver.endpoint, inbox.path))
        pack(chunks("meta"))  # torch loads its meta kernels on first use: seconds, once
        tasks = TaskScope("test")
        copies = HostCopies()
        router = StepRouter(tasks, copies)  # type: ignore[arg-type]
        route = router.route(ref)
        for chunk in chunks("meta"):
            route.add(Sender(), chunk)
        step = await probe.expect_message(StepChunks)
        assert copies.copies == 1
        assert copies.concats == 1  # packed by the stage's transfers, once per field
        got = unpack(step)
        assert len(got) == B
        assert all(c.tensors["codes"].shape == (ROWS, 4) for c in got)
        assert all(bool((c.tensors["codes"] == 7.0).all()) for c in got)
        # A lone chunk is copied alone, and goes as itself.
        route.add(Sender(), chunks("meta")[0])
        assert isinstance(await probe.expect_message(Chunk), Chunk)
        assert copies.copies == 2
        await tasks.cancel(1.0, "test over")
