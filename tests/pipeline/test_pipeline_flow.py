"""Flow control per (session, edge) stream: every queue stays within its credit window.

A slow stage slows its own session's producers and nothing else; a caller that stops
reading its events makes the output stages wait, then gets a clear ``backpressure``
error at its deadline; a sender that goes past its window is refused as a protocol error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import torch
from pipeline_helpers import armed, assert_nothing_held, done, samples_of, text_of

from omni_actors.actors.stage.actor import StageActor
from omni_actors.actors.stage.flow import BackpressureError, CreditWindow
from omni_actors.clock import LoopClock
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session_actor import SessionActor
from omni_actors.pipeline.session_channel import SessionChannel
from omni_actors.pipeline.session_input import SessionClosedError
from omni_actors.pipeline.session_path import StagePlan
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.control import (
    Cancel,
    CancelResponse,
    Deadlines,
    Inspect,
    Prewarm,
    StageMessage,
    StreamCredit,
)
from omni_actors.protocols.events import Done, Event, SessionError
from omni_actors.protocols.stage import INPUT, Chunk, SessionKey, StageReport
from omni_actors.testing import ActorTestKit, TestProbe, eventually
from omni_actors.testing.inspection import mailbox_depth

WINDOW = 8
OUTPUTS = 400  # thinker outputs per session: 50 windows
TEXT = "".join(f"t{k} " for k in range(OUTPUTS))
WAIT_S = 30.0  # a test's own bound; the sessions take well under a second


def flow_spec(
    *,
    thinker: dict[str, Any] | None = None,
    code2wav: dict[str, Any] | None = None,
    deadlines: dict[str, float] | None = None,
    process: bool = False,
) -> PipelineSpec:
    """A thinker that answers at once, a talker as fast, and one codec frame per chunk
    (no chunk policy), so only the windows hold chunks back."""
    stages = {
        "thinker": {
            "outputs": OUTPUTS,
            "first_output_s": 0.0,
            "per_output_s": 0.0,
            **(thinker or {}),
        },
        "talker": {"outputs_per_input": 1, "fields": ["codes"]},
        "code2wav": {
            "outputs_per_input": 1,
            "fields": ["audio"],
            "audio_samples": 24,
            **(code2wav or {}),
        },
    }
    return PipelineSpec.model_validate(
        {
            "name": "flow-omni",
            "stages": [
                {"name": name, "engine": {"kind": "scripted", "args": args}, "process": process}
                for name, args in stages.items()
            ],
            "edges": [
                {"from": "thinker", "to": "talker", "fields": ["hidden", "token_ids"]},
                {"from": "talker", "to": "code2wav", "fields": ["codes"]},
            ],
            "outputs": {"text": "thinker", "audio": "code2wav"},
            "deadlines": deadlines or {},
            "flow": {"window": WINDOW},
        }
    )


PEAKS: dict[str, dict[str, int]] = {}


class MeasuringStage(StageActor):
    """Records, at every message, the most chunks queued for one session and the most
    messages waiting in the stage's mailbox."""

    async def receive(self, message: StageMessage) -> Any:
        peaks = PEAKS.setdefault(self.name, {"mailbox": 0, "session": 0})
        peaks["mailbox"] = max(peaks["mailbox"], mailbox_depth(self.context.self_ref))
        result = await super().receive(message)
        queued = max((s.queued for s in self.sessions.values()), default=0)
        peaks["session"] = max(peaks["session"], queued)
        return result


@pytest.mark.parametrize("placement", ["local", "process"])
async def test_a_slow_last_stage_keeps_every_queue_within_its_window(placement: str) -> None:
    # code2wav takes 1 ms per frame; the thinker and talker produce 400 in no time. On
    # an unbounded queue, code2wav's would hold ~400 chunks.
    spec = flow_spec(code2wav={"per_output_s": 0.001}, process=placement == "process")
    PEAKS.clear()
    stages: dict[str, type[StageActor]] = {}
    if placement == "local":  # a worker process runs the stage class it is given
        stages = {name: MeasuringStage for name in ("thinker", "talker", "code2wav")}
    async with OmniPipeline(spec, stage_classes=stages) as omni:
        async with omni.session() as session:
            await session.send(text="hello")
            await session.finish()
            events: list[Event] = []
            most_waiting = 0
            async with asyncio.timeout(WAIT_S):
                async for event in session:
                    most_waiting = max(most_waiting, session.channel.queued)
                    events.append(event)
        metrics = done(events).metrics
        assert text_of(events) == TEXT
        assert samples_of(events) == OUTPUTS * 24
        queued = {name: stage.queued_max for name, stage in metrics.stages.items()}
        assert all(0 < q <= WINDOW for q in queued.values()), queued
        assert queued["code2wav"] > WINDOW // 2, queued  # the slow one used its window
        if placement == "local":
            for name, peaks in PEAKS.items():
                # A window of chunks, and a prewarm or an inspection at most.
                assert peaks["mailbox"] <= WINDOW + 1, (name, PEAKS)
                assert peaks["session"] <= WINDOW, (name, PEAKS)
        # The caller's channel: a window of chunks per output stage, and the terminal.
        assert most_waiting <= 2 * WINDOW + 1
        await assert_nothing_held(omni)


@pytest_asyncio.fixture
async def kit() -> AsyncIterator[ActorTestKit]:
    async with ActorTestKit(virtual_time=True) as kit:
        yield kit


async def test_a_stalled_caller_blocks_only_its_own_session_then_fails_at_its_deadline(
    kit: ActorTestKit,
) -> None:
    inter_chunk_s = 2.0
    spec = flow_spec(deadlines={"inter_chunk_s": inter_chunk_s})
    async with OmniPipeline(spec, system=kit.system) as omni:
        # A text-only session on the thinker whose caller never reads: the thinker sends
        # it one window of text, then waits for a credit.
        stalled = omni.session(modalities=("text",))
        async with stalled:
            await stalled.send(text="hello")
            await stalled.end_segment()
            await armed(kit, inter_chunk_s)  # the thinker's wait for the caller's credit
            await kit.eventually(lambda: stalled.channel.queued == WINDOW)
            # Meanwhile, another session on the same thinker streams to its end.
            async with asyncio.timeout(WAIT_S):
                other = [e async for e in omni.generate(text="hi")]
            assert text_of(other) == TEXT
            assert samples_of(other) == OUTPUTS * 24
            assert isinstance(other[-1], Done)
            # The stalled one is still waiting, and held no more than its window.
            assert not stalled.ended
            assert stalled.channel.queued == WINDOW
            await armed(kit, inter_chunk_s)
            kit.virtual_clock.advance(inter_chunk_s - 0.01)
            await kit.consistently(lambda: not stalled.ended, duration=0.05)
            kit.virtual_clock.advance(0.01)
            async with asyncio.timeout(WAIT_S):
                events = [e async for e in stalled.events()]
        error = events[-1]
        assert isinstance(error, SessionError), events[-3:]
        assert text_of(events) == TEXT[: len(text_of(events))]
        assert len(events) == WINDOW + 1
        assert error.code == "backpressure"
        assert error.stage == "thinker"
        assert "not reading the session's events" in error.message
        assert "inter_chunk_s" in error.message
        await assert_nothing_held(omni)


# An entry stage that takes its first input, then works on it for an hour.
STUCK = {"outputs_per_input": 1, "first_output_s": 3600.0}


async def test_a_caller_whose_input_is_not_taken_gets_a_backpressure_error(
    kit: ActorTestKit,
) -> None:
    inter_chunk_s = 2.0
    spec = flow_spec(thinker=STUCK, deadlines={"inter_chunk_s": inter_chunk_s})
    async with OmniPipeline(spec, system=kit.system) as omni:
        async with omni.session() as session:

            async def send_input() -> None:
                for _ in range(2 * WINDOW):
                    await session.send(text="more")

            sending = asyncio.ensure_future(send_input())
            await armed(kit, inter_chunk_s)  # send waits for the thinker's credit
            assert not sending.done()
            kit.virtual_clock.advance(inter_chunk_s)
            with pytest.raises(BackpressureError, match="stage thinker is not taking its input"):
                await sending
            assert session.ended
            async with asyncio.timeout(WAIT_S):
                events = [e async for e in session.events()]
        error = events[-1]
        assert isinstance(error, SessionError), events
        assert (error.code, error.stage) == ("backpressure", "thinker")
        await assert_nothing_held(omni)


async def test_a_send_waiting_for_a_credit_ends_with_its_session() -> None:
    async with OmniPipeline(flow_spec(thinker=STUCK)) as omni:
        async with omni.session() as session:

            async def send_input() -> None:
                for _ in range(2 * WINDOW):
                    await session.send(text="more")

            sending = asyncio.ensure_future(send_input())
            await eventually(lambda: session.channel.input.credits == 0)
            assert not sending.done()
            await session.abort("the caller hung up")
            with pytest.raises(SessionClosedError, match="has ended"):
                async with asyncio.timeout(WAIT_S):
                    await sending
        await assert_nothing_held(omni)


async def test_a_closed_window_gives_no_credit() -> None:
    # Its stream ended (its session was cut or ended): what would be sent is moot, even
    # with credits left in hand.
    window = CreditWindow(WINDOW)
    window.close()
    assert not window.try_take()
    assert not await window.take(LoopClock(), WAIT_S)
    assert window.credits == WINDOW


class GreedyStage(StageActor):
    """Gives its own outlets a window far larger than the pipeline's: it never waits."""

    def _prewarm(self, message: Prewarm) -> bool:
        return super()._prewarm(msgspec.structs.replace(message, window=100 * WINDOW))


async def test_a_stage_past_its_window_to_the_caller_fails_the_session() -> None:
    spec = flow_spec()
    async with OmniPipeline(spec, stage_classes={"thinker": GreedyStage}) as omni:
        async with omni.session(modalities=("text",)) as session:
            await session.send(text="hello")
            await session.end_segment()
            # The caller reads nothing: the thinker's chunks pile up past the window.
            await eventually(lambda: session.ended, timeout=WAIT_S)
            async with asyncio.timeout(WAIT_S):
                events = [e async for e in session.events()]
        error = events[-1]
        assert isinstance(error, SessionError), events[-3:]
        assert error.code == "internal"
        assert error.stage == "thinker"
        assert "WindowExceededError" in error.error_type
        assert f"more than {WINDOW} chunks in flight" in error.message
        assert len(events) <= WINDOW + 1  # the chunk past the window was refused
        await assert_nothing_held(omni)


# -- one stage, driven by probes ----------------------------------------------------------

KEY = SessionKey("s#1")
DEADLINES = Deadlines(first_chunk_s=30, inter_chunk_s=30, idle_s=30, total_s=60)


def prewarm(owner: TestProbe, window: int) -> Prewarm:
    return Prewarm(key=KEY, owner=owner.ref, sources=(INPUT,), deadlines=DEADLINES, window=window)


def chunk(seq: int, end: str = "") -> Chunk:
    return Chunk(
        key=KEY,
        source=INPUT,
        seq=seq,
        tensors={"hidden": torch.zeros(1, 4)},
        end=end,  # type: ignore[arg-type]
    )


async def next_report(owner: TestProbe) -> StageReport:
    """The owner's next report, past the credits it is granted for the input."""
    while True:
        [message] = await owner.receive_messages(1, timeout=WAIT_S)
        if isinstance(message, StageReport):
            return message
        assert isinstance(message, StreamCredit), message


async def test_a_sender_past_its_window_is_refused_as_a_protocol_error() -> None:
    async with ActorTestKit() as kit:
        owner = await kit.create_probe()
        # The engine takes the first chunk, then works on it for an hour.
        stage = await kit.spawn(
            StageActor, "talker", "scripted", {"outputs_per_input": 1, "first_output_s": 3600}
        )
        assert await stage.ask(prewarm(owner, window=2)) is True
        # The engine takes one chunk at most, granted back at once: with five sent,
        # three or more are in flight.
        for seq in range(5):
            await stage.tell(chunk(seq))
        report = await next_report(owner)
        assert report.end == "error"
        assert report.code == "internal"
        assert "WindowExceededError" in report.error_type
        assert "more than 2 chunks in flight" in report.error
        assert (await stage.ask(Inspect())).keys == []


async def test_the_receiver_grants_credits_as_its_engine_takes_chunks() -> None:
    async with ActorTestKit() as kit:
        owner = await kit.create_probe()
        stage = await kit.spawn(StageActor, "talker", "scripted", {"outputs_per_input": 1})
        assert await stage.ask(prewarm(owner, window=4)) is True
        # A window of 4 is granted back two chunks at a time.
        for seq in range(4):
            await stage.tell(chunk(seq))
        credits = [await owner.expect_message(StreamCredit, timeout=WAIT_S) for _ in range(2)]
        assert credits == [StreamCredit(key=KEY, source=INPUT, receiver="talker", n=2)] * 2
        # The credits are spent: four more chunks, the last ending the session.
        for seq in range(4, 8):
            await stage.tell(chunk(seq, end="finished" if seq == 7 else ""))
        for _ in range(2):
            assert await owner.expect_message(StreamCredit, timeout=WAIT_S) == credits[0]
        report = await owner.expect_message(StageReport, timeout=WAIT_S)
        assert report.end == "finished"
        assert report.metrics.chunks_in == 8


async def test_a_late_credit_for_a_session_gone_from_the_stage_is_ignored() -> None:
    async with ActorTestKit() as kit:
        owner = await kit.create_probe()
        stage = await kit.spawn(StageActor, "talker", "scripted", {"outputs_per_input": 1})
        assert await stage.ask(prewarm(owner, window=4)) is True
        await stage.tell(chunk(0, end="finished"))
        assert (await next_report(owner)).end == "finished"
        await stage.tell(StreamCredit(key=KEY, source="talker", receiver="code2wav", n=2))
        late = StreamCredit(key=SessionKey("never#9"), source="talker", receiver="client", n=2)
        await stage.tell(late)
        assert (await stage.ask(Inspect())).keys == []
        assert stage.is_alive


async def test_the_chunks_a_cancelled_reply_drops_are_granted_back() -> None:
    async with ActorTestKit() as kit:
        stage = await kit.create_probe()
        channel = SessionChannel(sample_rate=24000, window=2)  # a credit per chunk taken
        plan = {"thinker": StagePlan(stage.ref, (INPUT,), (), ("text",))}
        session = await kit.spawn(
            SessionActor, "s", KEY, plan, DEADLINES, True, kit.system.clock.now() + 5, channel
        )
        assert await session.ask(CancelResponse(segment=0)) is True
        await stage.expect_message(Cancel)
        # The thinker's last words, sent before the cancel reached it: the caller will
        # never read them, so they are taken as they arrive.
        for seq in range(3):
            await session.tell(Chunk(key=KEY, source="thinker", seq=seq, texts={"text": "so"}))
        for _ in range(3):
            credit = await stage.expect_message(StreamCredit, timeout=WAIT_S)
            assert credit == StreamCredit(key=KEY, source="thinker", receiver="client", n=1)
        assert channel.queued == 0
