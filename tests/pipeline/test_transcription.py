"""Transcription of the caller's input: a transcriber stage fanned out from the caller's
input beside the entry stage (``outputs.transcript``), off the reply's path.

Driven through ``TurnEcho`` (``conversation_engines``) as the entry stage and
``CountingTranscriber`` (``transcriber_engines``), whose transcript of a turn says how
many samples it heard.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import torch
import transcriber_engines
from transcriber_engines import CountingTranscriber

from omni_actors.errors import InvalidRequestError
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.spec.pipeline import PipelineConfigError, PipelineSpec, load_pipeline
from omni_actors.protocols.events import (
    Event,
    ResponseDone,
    TextDelta,
    TranscriptDone,
    TranscriptFailed,
)
from omni_actors.testing import eventually, kill_worker
from omni_actors.testing.inspection import actor_instance

SAMPLE_RATE = 1000


def spec_data(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "transcribed",
        "stages": [
            {"name": "echo", "engine": {"kind": "conversation_engines:TurnEcho"}},
            {"name": "asr", "engine": {"kind": "transcriber_engines:CountingTranscriber"}},
        ],
        "outputs": {"text": "echo", "transcript": "asr", "sample_rate": SAMPLE_RATE},
        "inputs": {"sample_rate": SAMPLE_RATE},
        "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
    }
    data.update(over)
    return data


@asynccontextmanager
async def transcribed(*, transcription: bool = True) -> AsyncIterator[tuple[OmniPipeline, Session]]:
    spec = PipelineSpec.model_validate(spec_data())
    async with (
        OmniPipeline(spec) as omni,
        omni.session(modalities=("text",), transcription=transcription) as session,
    ):
        yield omni, session


async def events_until(session: Session, done: int, transcripts: int) -> list[Event]:
    """The session's events until ``done`` ResponseDones and ``transcripts`` transcript
    events (done or failed) have come."""
    events: list[Event] = []
    async with asyncio.timeout(10):
        while (
            sum(isinstance(e, ResponseDone) for e in events) < done
            or sum(isinstance(e, TranscriptDone | TranscriptFailed) for e in events) < transcripts
        ):
            events.append(await session.next_event())
    return events


def speech(samples: int) -> torch.Tensor:
    return torch.full((samples,), 0.25)


async def test_each_user_audio_turn_gets_its_transcript() -> None:
    async with transcribed() as (_, session):
        await session.transcribe(language="en")
        await session.send(audio=speech(300))
        await session.send(audio=speech(200))
        await session.commit(turn="u1")
        await session.send(text="hi")  # a turn with no audio: no transcript
        await session.commit(turn="u2")
        await session.send(audio=speech(700))
        await session.commit(turn="u3")
        await session.respond()
        events = await events_until(session, done=1, transcripts=2)
        transcripts = [e for e in events if isinstance(e, TranscriptDone)]
        assert [(t.item, t.transcript) for t in transcripts] == [
            ("u1", "500 samples en"),
            ("u3", "700 samples en"),
        ]
        assert all(t.session == session.id for t in transcripts)
        done = next(e for e in events if isinstance(e, ResponseDone))
        assert done.status == "completed"
        assert "asr" not in done.metrics.stages  # the reply is not the transcriber's
        # The next turn, after a reply, in the next segment.
        await session.send(audio=speech(100))
        await session.commit(turn="u4")
        (later,) = await events_until(session, done=0, transcripts=1)
        assert later == TranscriptDone(session=session.id, item="u4", transcript="100 samples en")


async def test_the_reply_never_waits_for_the_transcriber() -> None:
    gate = transcriber_engines.GATE["open"] = asyncio.Event()
    try:
        async with transcribed() as (_, session):
            await session.transcribe()
            await session.send(audio=speech(400))
            await session.commit(turn="u1")
            response = await session.respond()
            async with asyncio.timeout(10):  # the transcriber holds its transcript meanwhile
                events = [event async for event in response.events()]
            assert isinstance(events[-1], ResponseDone)
            assert events[-1].status == "completed"
            assert "".join(e.text for e in events if isinstance(e, TextDelta)) == ""
            assert not any(isinstance(e, TranscriptDone) for e in events)  # still held
            gate.set()
            (event,) = await events_until(session, done=0, transcripts=1)
            assert event == TranscriptDone(session=session.id, item="u1", transcript="400 samples")
    finally:
        del transcriber_engines.GATE["open"]


async def test_reading_through_responses_misses_no_transcript() -> None:
    # The docs' promise: the session's events include the transcripts. A caller that
    # reads the conversation through its responses gets them among the reply's events.
    gate = transcriber_engines.GATE["open"] = asyncio.Event()
    try:
        async with transcribed() as (_, session):
            await session.transcribe()
            await session.send(audio=speech(400))
            await session.commit(turn="u1")
            first = await session.respond()
            assert isinstance(await first.wait(), ResponseDone)  # the transcript is held
            gate.set()
            await eventually(lambda: session.channel.queued, what="the transcript is queued")
            await session.send(text="hi")
            second = await session.respond()
            async with asyncio.timeout(10):
                events = [event async for event in second.events()]
            assert TranscriptDone(session=session.id, item="u1", transcript="400 samples") in events
            assert isinstance(events[-1], ResponseDone)
            assert events[-1].response == second.id
    finally:
        del transcriber_engines.GATE["open"]


async def test_cancelling_a_reply_keeps_its_turns_transcripts() -> None:
    gate = transcriber_engines.GATE["open"] = asyncio.Event()
    try:
        async with transcribed() as (_, session):
            await session.transcribe()
            for item in ("u1", "u2"):
                await session.send(text="hello", audio=speech(100))
                await session.commit(turn=item)
            response = await session.respond()
            assert await response.cancel()
            gate.set()  # the transcripts come once the reply is cancelled
            events = await events_until(session, done=1, transcripts=2)
            assert [e.item for e in events if isinstance(e, TranscriptDone)] == ["u1", "u2"]
    finally:
        del transcriber_engines.GATE["open"]


async def test_a_failed_transcript_fails_alone() -> None:
    async with transcribed() as (_, session):
        await session.transcribe()
        for item in ("bad", "crash"):
            await session.send(text="x", audio=speech(100))
            await session.commit(turn=item)
            _, events, done = await reply_and_transcripts(session)
            assert done.status == "completed"  # the reply went on
            (failed,) = [e for e in events if isinstance(e, TranscriptFailed)]
            # A turn the engine answers with an error names its item; an engine that
            # fails its segment fails every turn not transcribed yet (no item).
            assert failed.item == ("bad" if item == "bad" else "")
            assert failed.code == "engine_error"
        # The transcriber serves the next turns: an engine failure fails one segment.
        await session.send(audio=speech(50))
        await session.commit(turn="ok")
        (event,) = await events_until(session, done=0, transcripts=1)
        assert event == TranscriptDone(session=session.id, item="ok", transcript="50 samples")


async def reply_and_transcripts(
    session: Session, transcripts: int = 1
) -> tuple[str, list[Event], ResponseDone]:
    await session.respond()
    events = await events_until(session, done=1, transcripts=transcripts)
    done = next(e for e in events if isinstance(e, ResponseDone))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, events, done


async def test_a_reopened_session_keeps_transcribing_with_its_settings() -> None:
    stages = spec_data()["stages"]
    stages[0] = {
        **stages[0],
        "process": True,
        "engine": {"kind": "conversation_engines:ReplayEcho"},
    }
    spec = PipelineSpec.model_validate(
        spec_data(
            stages=stages, deadlines={"idle_s": 60.0, "inter_chunk_s": 30.0, "admission_s": 60.0}
        )
    )
    async with OmniPipeline(spec) as omni, omni.session(transcription=True) as session:
        await session.transcribe(language="en")
        await session.send(text="hello")
        await reply_and_transcripts(session, transcripts=0)
        kill_worker((await omni.stages())["echo"])

        async def told() -> None:
            assert session.channel.stale

        await eventually(told)
        # The next input reopens the session on every stage (the transcriber too).
        await session.send(audio=speech(120))
        await session.commit(turn="after")
        _, events, done = await reply_and_transcripts(session)
        assert done.status == "completed"
        (transcript,) = [e for e in events if isinstance(e, TranscriptDone)]
        assert transcript.transcript == "120 samples en"  # its language told again


async def test_a_transcriber_that_dies_fails_transcription_only() -> None:
    stages = spec_data()["stages"]
    stages[1] = {**stages[1], "process": True}
    spec = PipelineSpec.model_validate(spec_data(stages=stages))
    async with OmniPipeline(spec) as omni, omni.session(transcription=True) as session:
        await session.transcribe()
        await session.send(text="hi", audio=speech(100))
        kill_worker((await omni.stages())["asr"])
        (failed,) = await events_until(session, done=0, transcripts=1)
        assert isinstance(failed, TranscriptFailed)
        assert (failed.item, failed.code) == ("", "stage_failed")
        # The conversation goes on; the transcriber gets nothing more of this session.
        await session.commit(turn="u1")
        text, _, done = await reply_and_transcripts(session, transcripts=0)
        assert done.status == "completed"
        assert text == "HI"
        assert not session.channel.stale


async def test_audio_reaches_the_transcriber_only_while_transcribing() -> None:
    async with transcribed() as (omni, session):
        engine = actor_instance((await omni.stages())["asr"]).engine
        assert isinstance(engine, CountingTranscriber)
        await session.send(audio=speech(300))
        await session.commit(turn="unheard")
        await session.transcribe()
        await session.send(audio=speech(200))
        await session.commit(turn="heard")
        await session.transcribe(False)
        await session.send(audio=speech(900))
        await session.commit(turn="unheard")
        await session.respond()
        events = await events_until(session, done=1, transcripts=1)
        assert [e.item for e in events if isinstance(e, TranscriptDone)] == ["heard"]
        assert list(engine.heard.values()) == [200]


async def test_a_session_without_transcription_leaves_the_transcriber_alone() -> None:
    async with transcribed(transcription=False) as (omni, session):
        with pytest.raises(InvalidRequestError, match="transcription=True"):
            await session.transcribe()
        await session.send(audio=speech(100))
        await session.respond()
        await events_until(session, done=1, transcripts=0)
        sessions = await omni.live_sessions()
        assert sessions["asr"] == []
        assert sessions["echo"] == [session.id]


async def test_a_pipeline_without_a_transcriber_refuses_transcription() -> None:
    spec = PipelineSpec.model_validate(
        spec_data(stages=spec_data()["stages"][:1], outputs={"text": "echo"})
    )
    async with OmniPipeline(spec) as omni:
        with pytest.raises(InvalidRequestError, match="no transcriber"):
            omni.session(transcription=True)


# -- an entry stage that transcribes ------------------------------------------------------


def recognizing(*, echo: str = "TurnEcho", process: bool = False) -> PipelineSpec:
    """The recognizer as the entry stage and transcriber, the echo after it."""
    return PipelineSpec.model_validate(
        spec_data(
            stages=[
                {"name": "asr", "engine": {"kind": "transcriber_engines:CountingRecognizer"}},
                {
                    "name": "echo",
                    "process": process,
                    "engine": {"kind": f"conversation_engines:{echo}"},
                },
            ],
            edges=[{"from": "asr", "to": "echo", "mode": "stream"}],
            deadlines={"idle_s": 60.0, "inter_chunk_s": 30.0, "admission_s": 60.0},
        )
    )


async def test_an_entry_that_transcribes_tells_the_turns_heard_while_transcribing() -> None:
    spec = recognizing()
    assert spec.side_transcriber is None
    assert spec.without_transcriber().stages == spec.stages  # it is the reply's too
    async with OmniPipeline(spec) as omni, omni.session(transcription=True) as session:
        await session.send(audio=speech(300))
        await session.commit(turn="before")
        await session.transcribe(language="en")
        await session.send(audio=speech(200))
        await session.commit(turn="heard")
        await session.send(text="hi")  # a turn with no audio: no transcript
        await session.commit(turn="typed")
        await session.transcribe(False)  # the turn is heard, its transcript not told
        await session.send(audio=speech(900))
        await session.commit(turn="after")
        text, events, done = await reply_and_transcripts(session)
        assert done.status == "completed"
        told = [e for e in events if isinstance(e, TranscriptDone | TranscriptFailed)]
        assert told == [
            TranscriptDone(session=session.id, item="heard", transcript="200 samples en")
        ]
        # The next stage gets each turn's text once, and with the settings of its time.
        assert text == "300 SAMPLES|200 SAMPLES EN|HI|900 SAMPLES"


async def test_a_replayed_conversation_tells_no_transcript_again() -> None:
    async with (
        OmniPipeline(recognizing(echo="ReplayEcho", process=True)) as omni,
        omni.session(transcription=True) as session,
    ):
        await session.transcribe(language="en")
        await session.send(audio=speech(100))
        await session.commit(turn="first")
        _, events, _ = await reply_and_transcripts(session)
        assert [e.item for e in events if isinstance(e, TranscriptDone)] == ["first"]
        kill_worker((await omni.stages())["echo"])

        async def told() -> None:
            assert session.channel.stale

        await eventually(told)
        # The next input replays the conversation onto every stage (the entry hears the
        # first turn again), then the new turn: only the new one is told.
        await session.send(audio=speech(120))
        await session.commit(turn="second")
        _, events, done = await reply_and_transcripts(session)
        assert done.status == "completed"
        told_again = [(e.item, e.transcript) for e in events if isinstance(e, TranscriptDone)]
        assert told_again == [("second", "120 samples en")]  # its settings replayed too


# -- the definition ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"transcript": "nobody"}, "outputs.transcript: no stage 'nobody'"),
        ({"transcript": "echo"}, "'echo' is an output of the reply too"),
    ],
)
def test_the_transcript_names_a_stage_that_yields_transcripts(
    over: dict[str, str], message: str
) -> None:
    outputs = {**spec_data()["outputs"], **over}
    with pytest.raises(ValueError, match=message):
        PipelineSpec.model_validate(spec_data(outputs=outputs))


def test_the_transcriber_has_no_edges() -> None:
    data = spec_data(edges=[{"from": "echo", "to": "asr"}])
    with pytest.raises(ValueError, match=r"has no edges; remove \['echo->asr'\]"):
        PipelineSpec.model_validate(data)


def test_the_transcriber_engine_declares_the_transcriber_ports() -> None:
    stages = spec_data()["stages"]
    stages[1] = {"name": "asr", "engine": {"kind": "scripted", "args": {"fields": ["text"]}}}
    with pytest.raises(ValueError, match=r"'asr' \(scripted\) must take .*transformers.asr"):
        PipelineSpec.model_validate(spec_data(stages=stages))


def test_a_transcriber_is_not_an_unreachable_stage(tmp_path: Any) -> None:
    spec = PipelineSpec.model_validate(spec_data())
    assert spec.stages_for(text=True, audio=False) == ["echo"]
    assert spec.stages_for(text=True, audio=False, transcript=True) == ["echo", "asr"]


def test_tiny_omni_transcribes() -> None:
    spec = load_pipeline("tiny-omni")
    assert spec.outputs.transcript == "transcriber"
    assert spec.stage("transcriber").engine.kind == "transformers.asr"
    # A release named for the pipeline is the reply stages': the transcriber keeps its own.
    other = spec.with_model("/releases/qwen3-omni")
    assert other.stage("thinker").engine.args["model"] == "/releases/qwen3-omni"
    assert "model" not in other.stage("transcriber").engine.args
    with pytest.raises(PipelineConfigError):
        load_pipeline("no-such-preset")
