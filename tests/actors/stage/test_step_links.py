"""One turn's chunks of many sessions through a device link: one slot, one ``put``.

Without CUDA the link's two ends are fakes: a sending side whose ``put`` takes every
tensor off the host into one slot (``meta`` tensors stand for the GPU's), and a mapped
receiving side that copies slices out of a store the test fills. A step's device fields
go into one slot with one ``put``; the receiver copies them out once and each session
gets its own rows, in order; a session aborted on either side gets none, and the slot
still comes back once; a step that does not fit goes member by member, each that fits
in a slot of its own and the rest through the host, that step only; a link that fails
fails the sessions of its step, not the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pytest
import torch

from omni_actors._task_scope import TaskScope
from omni_actors.actors.stage.actor import StageActor
from omni_actors.actors.stage.device_links import DeviceLinks, Outgoing
from omni_actors.actors.stage.outlet import Outlet
from omni_actors.actors.stage.steps import Route, StepRouter, unpack
from omni_actors.cuda import EventWaiter
from omni_actors.errors import ProtocolError
from omni_actors.protocols.control import Abort, Deadlines, Prewarm, Target
from omni_actors.protocols.device import (
    DeviceChunk,
    DeviceLinkLost,
    DeviceLinkOffer,
    DeviceSlice,
    SlotsFree,
)
from omni_actors.protocols.stage import INPUT, Chunk, SessionKey, StageReport, StepChunks
from omni_actors.protocols.tensors import TORCH_NAMES
from omni_actors.testing import ActorTestKit, TestProbe, eventually
from omni_actors.testing.inspection import actor_instance

KEYS = [SessionKey(f"s{i}#1") for i in range(4)]
LINK = 7
DEADLINES = Deadlines(first_chunk_s=5, inter_chunk_s=5, idle_s=5, total_s=10)
# torch loads its meta kernels at the first concatenation (seconds): here, not in a test.
torch.cat([torch.empty(1, 16, dtype=torch.int64, device="meta")] * 2)


# -- the sending side -------------------------------------------------------------------


class FakeLink:
    """A device link's sending side: ``put`` places every tensor off the host in one
    free slot, or nothing (too big for a slot, or none free), as ``DeviceLink.put``."""

    def __init__(self, slots: int = 4, slot_bytes: int = 1 << 16) -> None:
        self.id = LINK
        self.slot_bytes = slot_bytes
        self.free = list(range(slots))
        self.puts: list[dict[str, tuple[int, ...]]] = []
        self.fail_next: Exception | None = None

    def put(self, fields: Mapping[str, Any]) -> tuple[dict[str, DeviceSlice], dict[str, Any]]:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        placed = {
            k: v
            for k, v in fields.items()
            if isinstance(v, torch.Tensor) and v.device.type != "cpu"
        }
        rest = {k: v for k, v in fields.items() if k not in placed}
        if not placed:
            return {}, rest
        if sum(v.numel() * v.element_size() for v in placed.values()) > self.slot_bytes:
            return {}, dict(fields)
        if not self.free:
            return {}, dict(fields)
        slot = self.free.pop(0)
        self.puts.append({k: tuple(v.shape) for k, v in placed.items()})
        return {
            k: DeviceSlice(self.id, slot, TORCH_NAMES[v.dtype], tuple(v.shape))
            for k, v in placed.items()
        }, rest


class FakeTransfers:
    """A GPU stage's transfers: ``concat`` as ``torch.cat``, ``to_host`` counted (a
    device tensor's host copy is zeros of its shape: ``meta`` tensors hold no data)."""

    def __init__(self) -> None:
        self.concats = 0
        self.copies: list[dict[str, tuple[int, ...]]] = []

    def concat(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        self.concats += 1
        return torch.cat(list(parts))

    async def to_host(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        self.copies.append(
            {k: tuple(v.shape) for k, v in fields.items() if isinstance(v, torch.Tensor)}
        )
        return {
            k: torch.zeros(v.shape, dtype=v.dtype)
            if isinstance(v, torch.Tensor) and v.device.type != "cpu"
            else v
            for k, v in fields.items()
        }


class Sender:
    """An outlet as a route sees it."""

    def __init__(self) -> None:
        self.closed = False
        self.copy_wait = 0.0
        self.failed: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        self.failed = error


def on_device(key: SessionKey, seq: int, rows: int, **more: Any) -> Chunk:
    """A session's chunk with ``rows`` rows of codes on the (stand-in) device."""
    tensors = {"codes": torch.empty(rows, 16, dtype=torch.int64, device="meta"), **more}
    return Chunk(key=key, source="talker", seq=seq, tensors=tensors, texts={"text": key})


def linked_route(
    down: TestProbe, link: FakeLink, sender: Any
) -> tuple[Route, FakeTransfers, TaskScope]:
    tasks = TaskScope("test")
    transfers = FakeTransfers()
    router = StepRouter(tasks, transfers)  # type: ignore[arg-type]
    route = router.route(down.ref, Outgoing("code2wav", sender, link=link))  # type: ignore[arg-type]
    route.host = True  # as to a stage in another process
    return route, transfers, tasks


async def test_a_step_of_several_sessions_takes_one_slot_with_one_put() -> None:
    async with ActorTestKit() as kit:
        down, me = await kit.create_probe(), await kit.create_probe()
        link = FakeLink()
        route, transfers, tasks = linked_route(down, link, me.ref)
        senders = [Sender() for _ in KEYS]
        for i, (key, sender) in enumerate(zip(KEYS, senders, strict=True)):
            route.add(sender, on_device(key, 0, i + 1))
        step = await down.expect_message(StepChunks)
        assert len(link.puts) == 1  # one put for the step, not one per session
        assert link.puts[0] == {"codes": (10, 16)}
        assert step.device is not None
        assert step.device.link == LINK
        assert step.device.sender == me.ref
        assert step.device.slices["codes"].shape == (10, 16)
        assert step.rows == {"codes": (1, 2, 3, 4)}
        assert step.packed == {}
        assert [(c.key, c.seq, c.texts["text"]) for c in step.chunks] == [(k, 0, k) for k in KEYS]
        assert all("codes" not in c.tensors for c in step.chunks)
        assert transfers.copies == []  # nothing crossed through the host
        # The next step takes a slot of its own, with one put again; a lone chunk, too.
        for key, sender in zip(KEYS, senders, strict=True):
            route.add(sender, on_device(key, 1, 1))
        step = await down.expect_message(StepChunks)
        assert [(c.key, c.seq) for c in step.chunks] == [(k, 1) for k in KEYS]
        assert step.device is not None
        assert step.device.slices["codes"].slot == 1
        route.add(senders[2], on_device(KEYS[2], 2, 3))
        lone = await down.expect_message(Chunk)
        assert (lone.key, lone.seq) == (KEYS[2], 2)
        assert lone.device is not None
        assert lone.device.slices["codes"].shape == (3, 16)
        assert len(link.puts) == 3
        assert route.messages == 3
        assert all(s.failed is None for s in senders)
        await tasks.cancel(1.0, "test over")


async def test_a_field_one_member_carries_goes_into_the_slot_too() -> None:
    async with ActorTestKit() as kit:
        down, me = await kit.create_probe(), await kit.create_probe()
        link = FakeLink()
        route, transfers, tasks = linked_route(down, link, me.ref)
        hidden = torch.empty(2, 8, device="meta")
        route.add(Sender(), on_device(KEYS[0], 0, 1))
        route.add(Sender(), on_device(KEYS[1], 0, 2, hidden=hidden))
        step = await down.expect_message(StepChunks)
        assert link.puts == [{"codes": (3, 16), "hidden": (2, 8)}]
        assert step.rows == {"codes": (1, 2), "hidden": (-1, 2)}
        assert transfers.copies == []
        await tasks.cancel(1.0, "test over")


async def test_a_session_aborted_within_the_turn_puts_no_rows() -> None:
    async with ActorTestKit() as kit:
        down, me = await kit.create_probe(), await kit.create_probe()
        link = FakeLink()
        route, _, tasks = linked_route(down, link, me.ref)
        senders = [Sender() for _ in KEYS]
        for i, (key, sender) in enumerate(zip(KEYS, senders, strict=True)):
            route.add(sender, on_device(key, 0, i + 1))
        senders[1].closed = True
        step = await down.expect_message(StepChunks)
        assert [c.key for c in step.chunks] == [KEYS[0], KEYS[2], KEYS[3]]
        assert step.rows == {"codes": (1, 3, 4)}
        assert link.puts == [{"codes": (8, 16)}]
        # A turn whose every session was aborted puts nothing and sends nothing.
        for key, sender in zip(KEYS, senders, strict=True):
            sender.closed = True
            route.add(sender, on_device(key, 1, 1))
        await down.expect_no_message(0.05)
        assert len(link.puts) == 1
        assert route.settled() is None
        await tasks.cancel(1.0, "test over")


async def test_a_step_that_does_not_fit_the_link_goes_member_by_member() -> None:
    async with ActorTestKit() as kit:
        down, me = await kit.create_probe(), await kit.create_probe()
        link = FakeLink(slots=2, slot_bytes=8 * 16 * 5)  # five rows of codes a slot
        route, transfers, tasks = linked_route(down, link, me.ref)
        senders = [Sender() for _ in KEYS]

        def step(seq: int, rows: int) -> None:
            for key, sender in zip(KEYS, senders, strict=True):
                route.add(sender, on_device(key, seq, rows))

        step(0, 2)  # eight rows: more than a slot holds
        # The two members the free slots hold go each in its own, as a chunk ...
        for key in KEYS[:2]:
            alone = await down.expect_message(Chunk)
            assert alone.key == key
            assert alone.seq == 0
            assert alone.device is not None
            assert alone.tensors == {}
        assert link.puts == [{"codes": (2, 16)}, {"codes": (2, 16)}]
        # ... the others together through the host: one copy for them.
        rest = await down.expect_message(StepChunks)
        assert rest.device is None
        assert transfers.copies == [{"codes": (4, 16)}]
        assert rest.packed["codes"].device.type == "cpu"
        assert rest.rows == {"codes": (2, 2)}
        assert [(c.key, c.seq) for c in unpack(rest)] == [(k, 0) for k in KEYS[2:]]
        # Only their outlets waited for a copy (a hop's copy_wait_ms).
        waited = [sender.copy_wait for sender in senders]
        assert waited[:2] == [0.0, 0.0]
        assert all(w > 0 for w in waited[2:])
        link.free.extend((0, 1))  # the receiver gave both back
        step(1, 1)  # four rows fit one slot: one message, one put
        fits = await down.expect_message(StepChunks)
        assert fits.device is not None
        assert len(link.puts) == 3
        assert [sender.copy_wait for sender in senders] == waited  # no copy: no wait
        step(2, 1)
        await down.expect_message(StepChunks)  # the last free slot
        step(3, 1)  # none free: the whole step through the host, this step only
        held = await down.expect_message(StepChunks)
        assert held.device is None
        assert len(transfers.copies) == 2
        link.free.append(0)
        step(4, 1)
        again = await down.expect_message(StepChunks)
        assert again.device is not None
        for message, seq in ((fits, 1), (held, 3), (again, 4)):
            assert [(c.key, c.seq) for c in message.chunks] == [(k, seq) for k in KEYS]
        await tasks.cancel(1.0, "test over")


async def test_a_link_not_up_yet_leaves_the_step_on_the_host() -> None:
    async with ActorTestKit() as kit:
        down, me = await kit.create_probe(), await kit.create_probe()
        link = FakeLink()
        route, transfers, tasks = linked_route(down, link, me.ref)
        assert route.link is not None
        route.link.link = None  # offered, not accepted yet
        for key in KEYS[:2]:
            route.add(Sender(), on_device(key, 0, 1))
        step = await down.expect_message(StepChunks)
        assert step.device is None
        assert link.puts == []
        assert transfers.copies == [{"codes": (2, 16)}]
        await tasks.cancel(1.0, "test over")


async def test_a_link_that_fails_fails_the_sessions_of_its_step_only() -> None:
    async with ActorTestKit() as kit:
        down, me = await kit.create_probe(), await kit.create_probe()
        link = FakeLink()
        route, _, tasks = linked_route(down, link, me.ref)
        first, second = [Sender(), Sender()], [Sender(), Sender()]
        link.fail_next = RuntimeError("CUDA error: an illegal memory access")
        for key, sender in zip(KEYS[:2], first, strict=True):
            route.add(sender, on_device(key, 0, 1))
        await eventually(lambda: all(s.failed is not None for s in first), what="step failed")
        assert all("illegal memory access" in str(s.failed) for s in first)
        for key, sender in zip(KEYS[2:], second, strict=True):
            route.add(sender, on_device(key, 0, 1))
        step = await down.expect_message(StepChunks)
        assert [c.key for c in step.chunks] == KEYS[2:]
        assert step.device is not None
        assert all(s.failed is None for s in second)
        await tasks.cancel(1.0, "test over")


# -- the receiving side -----------------------------------------------------------------


class Done:
    """A copy's completion event that has completed."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class FakeImport:
    """A mapped link: ``take`` copies slices out of ``memory`` (by slot and field)."""

    def __init__(self, sender: Any) -> None:
        self.offer = DeviceLinkOffer(
            link=LINK, source="upstream", sender=sender, host="h/1", gpu="GPU-x",
            memory=b"", event=b"", slots=4, slot_bytes=1 << 16,
        )  # fmt: skip
        self.memory: dict[tuple[int, str], torch.Tensor] = {}
        self.takes = 0

    def take(self, slices: Mapping[str, DeviceSlice]) -> tuple[dict[str, torch.Tensor], Done]:
        self.takes += 1
        return {
            name: self.memory[piece.slot, name].clone() for name, piece in slices.items()
        }, Done()

    def close(self) -> None:
        pass


def prewarm(owner: TestProbe, key: SessionKey, down: Any) -> Prewarm:
    target = Target(stage="code2wav", ref=down, mode="stream", fields=("codes",), steps=True)
    return Prewarm(
        key=key,
        owner=owner.ref,
        sources=(INPUT,),
        targets=(target,),
        deadlines=DEADLINES,
        window=64,
    )


async def receiving_stage(
    kit: ActorTestKit, owner: TestProbe, down: TestProbe, sender: TestProbe
) -> tuple[Any, FakeImport, dict[SessionKey, list[Chunk]]]:
    """A stage whose sessions ``KEYS`` take input rows, with link ``LINK`` mapped from
    ``sender``; what each session is handed, by key."""
    stage = await kit.spawn(
        StageActor, "talker", "scripted", {"outputs_per_input": 1, "fields": ["codes"]}
    )
    for key in KEYS:
        assert await stage.ask(prewarm(owner, key, down.ref)) is True
    instance = actor_instance(stage)
    assert isinstance(instance, StageActor)
    links = DeviceLinks(
        "talker",
        torch.device("cuda", 0),
        stage,
        instance.context.tasks,
        EventWaiter(),
        slots=4,
        slot_bytes=1 << 16,
    )
    imported = FakeImport(sender.ref)
    links._in[LINK] = imported  # type: ignore[assignment]
    instance.device_links = links
    handed: dict[SessionKey, list[Chunk]] = {key: [] for key in KEYS}
    for session in instance.sessions.values():

        def deliver(chunk: Chunk, _to: Any = session.deliver) -> None:
            handed[chunk.key].append(chunk)
            _to(chunk)

        session.deliver = deliver  # type: ignore[method-assign]
    return stage, imported, handed


def device_step(
    imported: FakeImport, sender: TestProbe, slot: int, keys: list[SessionKey], seq: int
) -> tuple[StepChunks, dict[SessionKey, torch.Tensor]]:
    """A step of ``keys`` as a sender puts it in ``slot``: session ``i`` has ``i + 1``
    rows of its own values."""
    rows = {key: torch.full((i + 1, 4), float(10 * i + seq)) for i, key in enumerate(keys)}
    imported.memory[slot, "hidden"] = torch.cat(list(rows.values()))
    piece = DeviceSlice(LINK, slot, "float32", (sum(len(r) for r in rows.values()), 4))
    step = StepChunks(
        chunks=tuple(Chunk(key=key, source=INPUT, seq=seq) for key in keys),
        rows={"hidden": tuple(len(r) for r in rows.values())},
        device=DeviceChunk(LINK, sender.ref, {"hidden": piece}),
    )
    return step, rows


async def test_a_step_is_copied_out_once_and_each_session_gets_its_rows() -> None:
    async with ActorTestKit() as kit:
        owner, down, sender = [await kit.create_probe() for _ in range(3)]
        stage, imported, handed = await receiving_stage(kit, owner, down, sender)
        step, rows = device_step(imported, sender, 2, KEYS, 0)
        await stage.tell(step)
        free = await sender.expect_message(SlotsFree)
        assert (free.link, free.slots) == (LINK, (2,))
        assert imported.takes == 1
        await eventually(lambda: all(handed[k] for k in KEYS), what="every session's rows")
        for key in KEYS:
            [chunk] = handed[key]
            assert (chunk.seq, chunk.device) == (0, None)
            assert torch.equal(chunk.tensors["hidden"], rows[key])
        await sender.expect_no_message(0.05)  # the slot went back once
        # Their rows reach the engine: one output per input row, per session.
        outputs: list[Chunk] = []
        while len(outputs) < 10:
            message = await down.expect_message(object)
            assert isinstance(message, StepChunks | Chunk)
            outputs += unpack(message) if isinstance(message, StepChunks) else [message]
        assert sorted(c.key for c in outputs) == [
            k for i, k in enumerate(KEYS) for _ in range(i + 1)
        ]


async def test_a_session_aborted_on_the_receiver_gets_none_and_the_slot_goes_back_once() -> None:
    async with ActorTestKit() as kit:
        owner, down, sender = [await kit.create_probe() for _ in range(3)]
        stage, imported, handed = await receiving_stage(kit, owner, down, sender)
        assert await stage.ask(Abort(key=KEYS[1])) is True
        step, rows = device_step(imported, sender, 0, KEYS, 0)
        await stage.tell(step)
        free = await sender.expect_message(SlotsFree)
        assert free.slots == (0,)
        await eventually(lambda: all(handed[k] for k in (KEYS[0], *KEYS[2:])), what="rows")
        assert handed[KEYS[1]] == []
        for key in (KEYS[0], *KEYS[2:]):
            assert torch.equal(handed[key][0].tensors["hidden"], rows[key])
        assert imported.takes == 1
        # A step whose every session is gone is not copied out; its slot still goes back.
        for key in (KEYS[0], *KEYS[2:]):
            assert await stage.ask(Abort(key=key)) is True
        gone, _ = device_step(imported, sender, 3, KEYS, 1)
        await stage.tell(gone)
        free = await sender.expect_message(SlotsFree)
        assert free.slots == (3,)
        assert imported.takes == 1
        await sender.expect_no_message(0.05)


async def test_a_step_on_an_unknown_link_fails_its_sessions_not_the_others() -> None:
    async with ActorTestKit() as kit:
        owner, down, sender = [await kit.create_probe() for _ in range(3)]
        stage, imported, handed = await receiving_stage(kit, owner, down, sender)
        step, _ = device_step(imported, sender, 0, KEYS[:2], 0)
        device = step.device
        assert device is not None
        lost = msgspec.structs.replace(device, link=LINK + 1)  # the stage restarted since
        await stage.tell(msgspec.structs.replace(step, device=lost))
        notice = await sender.expect_message(DeviceLinkLost)
        assert notice.link == LINK + 1
        reports = await _reports(owner, 2)
        assert sorted(r.key for r in reports) == KEYS[:2]
        assert all(r.end == "error" and "DeviceLinkLostError" in r.error_type for r in reports)
        assert stage.is_alive
        again, rows = device_step(imported, sender, 1, KEYS[2:], 0)
        await stage.tell(again)
        await eventually(lambda: all(handed[k] for k in KEYS[2:]), what="the others' rows")
        assert torch.equal(handed[KEYS[3]][0].tensors["hidden"], rows[KEYS[3]])
        assert handed[KEYS[0]] == []
        assert handed[KEYS[1]] == []


async def _reports(owner: TestProbe, count: int) -> list[StageReport]:
    got: list[StageReport] = []
    while len(got) < count:
        message = await owner.expect_message(object)
        if isinstance(message, StageReport):
            got.append(message)
    return got


def test_a_step_with_its_device_part_still_on_is_not_unpacked() -> None:
    piece = DeviceSlice(LINK, 0, "float32", (1, 4))
    step = StepChunks(
        chunks=(Chunk(key=KEYS[0], source=INPUT, seq=0),),
        rows={"hidden": (1,)},
        device=DeviceChunk(LINK, None, {"hidden": piece}),  # type: ignore[arg-type]
    )
    with pytest.raises(ProtocolError, match="device part"):
        unpack(step)


async def test_a_windowed_outlet_on_a_route_joins_frames_with_the_stages_concat() -> None:
    """A talker's frames, windowed into code2wav's chunks and routed per step, are joined
    by its transfers (on its copy stream, marked), not by ``torch.cat`` on the event loop:
    an unmarked chunk's copy into the link waits for the step queued after its frames."""
    async with ActorTestKit() as kit:
        down, me = await kit.create_probe(), await kit.create_probe()
        route, transfers, tasks = linked_route(down, FakeLink(), me.ref)
        outlet = Outlet(KEYS[0], "talker", "code2wav", down.ref, ("codes",), window=(2, 4, 0, ()))
        outlet.use_route(route)
        for seq in range(6):
            frame = torch.full((1, 16), seq, dtype=torch.int64, device="meta")
            sent = outlet.push({"codes": frame})
            if sent is not None:
                await sent
        step = await down.expect_message(StepChunks)  # both chunks, handed over in one turn
        assert step.rows == {"codes": (2, 4)}
        assert transfers.concats == 3  # each chunk's frames joined, then the step packed
        await tasks.cancel(1.0, "test over")


class LoadRecorder:
    """A GPU stage's transfers as its sessions' inputs see them: ``load`` recorded."""

    def __init__(self) -> None:
        self.loads: list[tuple[set[str], frozenset[str]]] = []

    def load(self, fields: Mapping[str, Any], host: frozenset[str] = frozenset()) -> Any:
        self.loads.append((set(fields), frozenset(host)))
        return dict(fields)


async def test_inputs_the_engine_reads_on_the_host_are_not_loaded_to_its_device() -> None:
    """The talker's ``user_edits`` (row counts) read back from its GPU waited for the
    running frame step, on the event loop: a stage leaves its engine's ``host_inputs``
    in host memory."""
    async with ActorTestKit() as kit:
        owner, down = await kit.create_probe(), await kit.create_probe()
        stage = await kit.spawn(
            StageActor, "talker", "scripted", {"outputs_per_input": 1, "fields": ["codes"]}
        )
        instance = actor_instance(stage)
        assert isinstance(instance, StageActor)
        recorder = LoadRecorder()
        instance.transfers = recorder  # type: ignore[assignment]
        instance.host_inputs = frozenset({"count"})
        assert await stage.ask(prewarm(owner, KEYS[0], down.ref)) is True
        chunk = Chunk(key=KEYS[0], source=INPUT, seq=0, tensors={"count": torch.tensor([2])})
        await stage.tell(chunk)
        await eventually(lambda: bool(recorder.loads), what="the chunk's load")
        assert recorder.loads[0] == ({"count"}, frozenset({"count"}))
