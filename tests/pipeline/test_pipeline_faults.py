"""Faults on a running pipeline: duplicated, reordered and lost chunks on every edge, a
stage actor that crashes, an engine that fails, and a worker process killed mid-session.

Each fault ends exactly the sessions it touches — with ``Done`` where the protocol can
absorb it (duplicates), else with a ``SessionError`` whose code and stage say what
happened — promptly, leaving nothing held, while the other sessions carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable
from typing import Any

import pytest
import torch
from pipeline_helpers import assert_nothing_held, collect, done, make_spec, samples_of, text_of

from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Modality, Session
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.events import AudioDelta, Event, SessionError
from omni_actors.testing import ActorTestKit, kill_worker, worker_pid
from omni_actors.testing.chunk_faults import ChunkFaults, PipelineFaults
from omni_actors.testing.inspection import actor_instance

TEXT = "".join(f"t{k} " for k in range(8))  # the default thinker's 8 outputs
FULL_AUDIO = 8 * 2 * 240  # 8 thinker outputs x 2 talker frames x 240 samples
# Every wait is long, so a fault that ended a session by timing out would show.
PATIENT = {"first_chunk_s": 30.0, "inter_chunk_s": 30.0, "idle_s": 30.0}
# A thinker slow enough that the text-only sessions beside a fault are still running
# when it hits (8 outputs: ~165 ms), and the audio sessions are mid-stream.
SLOW_THINKER = {"per_output_s": 0.02}


def error_of(events: list[Event]) -> SessionError:
    """The final ``SessionError`` (fails the test with the events otherwise)."""
    last = events[-1] if events else None
    assert isinstance(last, SessionError), f"expected a SessionError last, got {events[-3:]}"
    return last


def audio_of(events: list[Event]) -> torch.Tensor:
    """Every audio sample of a stream, in order."""
    parts = [e.audio for e in events if isinstance(e, AudioDelta)]
    return torch.cat(parts) if parts else torch.zeros(0)


async def request(
    omni: OmniPipeline,
    *,
    inputs: int = 1,
    modalities: tuple[Modality, ...] = ("text", "audio"),
    session_id: str | None = None,
) -> list[Event]:
    """One session whose input arrives as ``inputs`` chunks (the last one finishes it)."""
    async with omni.session(modalities=modalities, session_id=session_id) as session:
        for k in range(inputs - 1):
            await session.send(text=f"part {k} ")
        await session.send(text="last", end="finished")
        return [e async for e in session]


async def finish_time(events: Awaitable[list[Event]]) -> tuple[list[Event], float]:
    """The events and the loop time at which the stream ended."""
    result = await events
    return result, asyncio.get_running_loop().time()


def stage_instance(refs: dict[str, Any], name: str) -> StageActor:
    instance = actor_instance(refs[name])
    assert isinstance(instance, StageActor), f"{name} is {instance!r}"
    return instance


# -- duplicates ------------------------------------------------------------------------

# (edge, duplicated seqs, receiving stage). Input: one chunk (seq 0, also its end).
# thinker -> talker: seq 0..7 outputs, 8 the end marker. talker -> code2wav: 16 frames
# windowed 4 + 6 + 6 (seq 0..2), then a bare end marker (seq 3). A duplicate of a
# session's very last chunk may arrive after the stage has reported, so none is used.
DUPLICATES = [
    pytest.param("input->thinker", {0}, "thinker", id="input-thinker"),
    pytest.param("thinker->talker", {0, 2, 7}, "talker", id="thinker-talker"),
    pytest.param("talker->code2wav", {0, 2}, "code2wav", id="talker-code2wav"),
]


@pytest.mark.parametrize(("edge", "seqs", "receiver"), DUPLICATES)
async def test_duplicate_chunks_are_dropped_and_counted(
    edge: str, seqs: set[int], receiver: str
) -> None:
    async with OmniPipeline(make_spec()) as omni:
        clean = await collect(omni.generate(text="hello"))
    faults = PipelineFaults(edges={edge: ChunkFaults(duplicate=frozenset(seqs))})
    async with OmniPipeline(make_spec(), **faults.hooks()) as omni:
        events = await collect(omni.generate(text="hello"))
        await assert_nothing_held(omni)
    expected, got = done(clean).metrics.stages, done(events).metrics.stages
    assert text_of(events) == text_of(clean) == TEXT
    assert samples_of(events) == samples_of(clean) == FULL_AUDIO
    assert torch.equal(audio_of(events), audio_of(clean))
    assert list(got) == list(expected) == ["thinker", "talker", "code2wav"]
    for name in expected:
        assert got[name].duplicates == (len(seqs) if name == receiver else 0), name
        assert got[name].chunks_in == expected[name].chunks_in, name
        assert got[name].outputs == expected[name].outputs, name
        assert got[name].hops == expected[name].hops, name


# -- gaps: out of order and missing chunks ----------------------------------------------

# (edge, seq, receiving stage, stream, input chunks). On the caller's input edge the
# session sends 3 chunks (seq 0..2) so that seq 1 is mid-stream; a 1-chunk session never
# reaches it, which leaves a clean text+audio session possible on the same pipeline.
GAPS = [
    pytest.param("input->thinker", 1, "thinker", "input -> thinker", 3, id="input-thinker"),
    pytest.param("thinker->talker", 3, "talker", "thinker -> talker", 1, id="thinker-talker"),
    pytest.param("talker->code2wav", 1, "code2wav", "talker -> code2wav", 1, id="talker-c2w"),
]


async def check_gap(
    faults: ChunkFaults, edge: str, seq: int, receiver: str, stream: str, inputs: int
) -> None:
    """A session crossing the faulty edge ends with ``chunk_gap`` at once, frees every
    stage, and leaves the pipeline serving.

    On a virtual clock that the test never advances: no deadline can expire, so the
    session's end comes from the gap itself, not from a timeout.
    """
    hooks = PipelineFaults(edges={edge: faults}).hooks()
    async with (
        ActorTestKit(virtual_time=True) as kit,
        OmniPipeline(make_spec(deadlines=PATIENT), system=kit.system, **hooks) as omni,
    ):
        events = await request(omni, inputs=inputs, session_id="gappy")
        error = error_of(events)
        assert error.code == "chunk_gap", error
        assert error.stage == receiver
        assert error.session == "gappy"
        assert f"{stream}: expected chunk {seq}, got {seq + 1}" in error.message
        assert error.error_type.endswith(":ChunkGapError")
        await assert_nothing_held(omni)

        # Faults apply to every session on the edge, always at the same seq: a text+audio
        # session crossing it again fails the same way (not at admission or prewarm: the
        # first one left no state behind on any stage).
        again = error_of(await request(omni, inputs=inputs))
        assert (again.code, again.stage) == ("chunk_gap", receiver), again
        # Sessions that never reach the fault are served as usual: text-only ones never
        # touch the audio edges, and a 1-chunk input never reaches input seq 1.
        text_only = await request(omni, modalities=("text",))
        assert text_of(text_only) == TEXT
        done(text_only)
        if inputs > 1:
            clean = await request(omni, inputs=1)
            done(clean)
            assert samples_of(clean) == FULL_AUDIO
        await assert_nothing_held(omni)


@pytest.mark.parametrize(("edge", "seq", "receiver", "stream", "inputs"), GAPS)
async def test_out_of_order_chunks_end_the_session_with_chunk_gap(
    edge: str, seq: int, receiver: str, stream: str, inputs: int
) -> None:
    await check_gap(ChunkFaults(swap=frozenset({seq})), edge, seq, receiver, stream, inputs)


@pytest.mark.parametrize(("edge", "seq", "receiver", "stream", "inputs"), GAPS)
async def test_a_missing_chunk_ends_the_session_with_chunk_gap(
    edge: str, seq: int, receiver: str, stream: str, inputs: int
) -> None:
    await check_gap(ChunkFaults(drop=frozenset({seq})), edge, seq, receiver, stream, inputs)


async def test_the_id_of_a_failed_session_can_be_used_again() -> None:
    faults = PipelineFaults(edges={"talker->code2wav": ChunkFaults(drop=frozenset({1}))})
    async with OmniPipeline(make_spec(), **faults.hooks()) as omni:
        failed = error_of(await collect(omni.generate(text="x", session_id="retry")))
        assert failed.code == "chunk_gap"
        await assert_nothing_held(omni)  # the id is no longer live anywhere
        # A retry under the same id (the fault is on an audio edge: a text-only retry
        # never meets it): ids are unique among *live* sessions only, and the stages,
        # which remember aborted sessions to refuse late prewarms, must not mistake the
        # retry for the failed session.
        retry = await collect(omni.generate(text="x", modalities=("text",), session_id="retry"))
        assert text_of(retry) == TEXT
        done(retry)
        await assert_nothing_held(omni)


# -- a stage actor crashes ---------------------------------------------------------------


async def test_a_crashing_stage_fails_only_its_sessions_and_is_restarted() -> None:
    audio_sessions, text_sessions = 3, 3
    # The talker's messages: 3 prewarms (all sessions are opened before any input is
    # sent), then the thinker's chunks, output k of every session ~20 ms after output
    # k - 1. Message 3 + 3 * 4 + 1 is the first chunk of output 4: every audio session
    # has had 4 chunks (8 frames: its first 4-frame audio window is out) and none has
    # had its last (9 chunks each), so every one of them is mid-stream.
    crash_at = audio_sessions + audio_sessions * 4
    faults = PipelineFaults(crash_after={"talker": crash_at})
    spec = make_spec(thinker=SLOW_THINKER, deadlines=PATIENT)
    async with OmniPipeline(spec, **faults.hooks()) as omni:
        refs = await omni.stages()
        talker = stage_instance(refs, "talker")
        talker_engine = talker.engine
        thinker = stage_instance(refs, "thinker")
        async with contextlib.AsyncExitStack() as stack:
            texts = [
                await stack.enter_async_context(omni.session(modalities=("text",)))
                for _ in range(text_sessions)
            ]
            audios = [
                await stack.enter_async_context(omni.session()) for _ in range(audio_sessions)
            ]
            for session in [*texts, *audios]:
                await session.send(text="x", end="finished")

            async def drain(session: Session) -> list[Event]:
                return [e async for e in session]

            results = await asyncio.gather(*(finish_time(drain(s)) for s in [*audios, *texts]))
        audio_results, text_results = results[:audio_sessions], results[audio_sessions:]
        for events, _ in audio_results:
            error = error_of(events)
            assert (error.code, error.stage) == ("stage_failed", "talker"), error
            assert "InjectedFault" in error.message
            assert text_of(events), "the thinker's text had started"
            assert 0 < samples_of(events) < FULL_AUDIO, "the crash was mid-stream"
        for events, _ in text_results:
            done(events)
            assert text_of(events) == TEXT
        # The text-only sessions were still running when the talker crashed.
        assert max(t for _, t in audio_results) < min(t for _, t in text_results)

        await assert_nothing_held(omni)
        # The orchestrator restarted the talker (same ref, new instance and engine); the
        # old engine was stopped with nothing left running in it. The thinker, which
        # did not fail, was not restarted.
        refs_after = await omni.stages()
        assert refs_after["talker"] == refs["talker"]
        restarted = stage_instance(refs_after, "talker")
        assert restarted is not talker
        assert restarted.engine is not talker_engine
        assert talker_engine is not None
        assert talker_engine.active_sessions == set()  # type: ignore[attr-defined]
        assert not talker_engine.started  # type: ignore[attr-defined]
        assert stage_instance(refs_after, "thinker") is thinker

        after = await asyncio.gather(*(collect(omni.generate(text="x")) for _ in range(3)))
        for events in after:
            done(events)
            assert samples_of(events) == FULL_AUDIO
        await assert_nothing_held(omni)


async def crash_one_replica(omni: OmniPipeline) -> tuple[SessionError, dict[str, str]]:
    """Two sessions, one per talker replica; one replica crashes mid-stream. Returns the
    failed session's error and each session's replica; checks the other one is served."""
    async with omni.session() as a, omni.session() as b:
        live = await omni.live_sessions()
        replica_of = {sid: actor for actor in ("talker-0", "talker-1") for sid in live[actor]}
        assert sorted(replica_of) == sorted([a.id, b.id])
        assert len(set(replica_of.values())) == 2  # least loaded: one session each
        for session in (a, b):
            await session.send(text="x", end="finished")
        results = await asyncio.gather(*(collect(aiter(s)) for s in (a, b)))
    failed = [events for events in results if isinstance(events[-1], SessionError)]
    served = [events for events in results if not isinstance(events[-1], SessionError)]
    assert len(failed) == len(served) == 1, [events[-1] for events in results]
    done(served[0])
    assert samples_of(served[0]) == FULL_AUDIO
    return error_of(failed[0]), replica_of


def talker_replicas() -> PipelineSpec:
    spec = make_spec(thinker=SLOW_THINKER, deadlines=PATIENT)
    stages = tuple(
        s.model_copy(update={"replicas": 2}) if s.name == "talker" else s for s in spec.stages
    )
    return spec.model_copy(update={"stages": stages})


# Per replica: its session's prewarm, then 4 chunks; the 5th chunk crashes whichever
# replica gets there first (one crash in all: the other replica carries on).
REPLICA_CRASH = PipelineFaults(crash_after={"talker": 1 + 4})


async def test_a_crashing_replica_fails_only_the_session_it_serves() -> None:
    async with OmniPipeline(talker_replicas(), **REPLICA_CRASH.hooks()) as omni:
        error, replica_of = await crash_one_replica(omni)
        assert error.code == "stage_failed"
        assert f"replica {replica_of[error.session]}:" in error.message
        assert "InjectedFault" in error.message
        await assert_nothing_held(omni)
        after = await asyncio.gather(*(collect(omni.generate(text="x")) for _ in range(2)))
        assert all(samples_of(done_events) == FULL_AUDIO for done_events in after)
        await assert_nothing_held(omni)


async def test_a_crashing_replica_is_reported_under_its_stage_name() -> None:
    async with OmniPipeline(talker_replicas(), **REPLICA_CRASH.hooks()) as omni:
        error, _ = await crash_one_replica(omni)
        assert error.code == "stage_failed"
        await assert_nothing_held(omni)
        # SessionError.stage is "the stage where it happened"; it is "talker-0"/"talker-1".
        assert error.stage == "talker", error


# -- an engine fails -------------------------------------------------------------------


async def test_an_engine_failure_ends_its_sessions_without_restarting_the_stage() -> None:
    spec = make_spec(thinker=SLOW_THINKER, code2wav={"fail_after": 3}, deadlines=PATIENT)
    async with OmniPipeline(spec) as omni:
        refs = await omni.stages()
        code2wav = stage_instance(refs, "code2wav")
        engine = code2wav.engine
        results = await asyncio.gather(
            *(finish_time(request(omni)) for _ in range(4)),
            *(finish_time(request(omni, modalities=("text",))) for _ in range(4)),
        )
        audio_results, text_results = results[:4], results[4:]
        for events, _ in audio_results:
            error = error_of(events)
            assert (error.code, error.stage) == ("engine_error", "code2wav"), error
            assert error.error_type.endswith(":ScriptedEngineError")
            assert "after 3 outputs" in error.message
            assert samples_of(events) == 3 * 240  # the 3 outputs before the failure
        for events, _ in text_results:
            done(events)
            assert text_of(events) == TEXT
        assert max(t for _, t in audio_results) < min(t for _, t in text_results)

        # A session-level error: the stage actor was not restarted and still answers.
        held = await omni.inspect()
        assert set(held) == {"thinker", "talker", "code2wav"}
        after = await omni.stages()
        assert stage_instance(after, "code2wav") is code2wav
        assert code2wav.engine is engine
        await assert_nothing_held(omni)
        # The engine fails every session the same way; the stage keeps serving them.
        again = error_of(await request(omni))
        assert (again.code, again.stage) == ("engine_error", "code2wav")
        await assert_nothing_held(omni)


# -- stages in worker processes ----------------------------------------------------------


def reaped(pid: int) -> bool:
    """True once ``pid`` has exited and been waited for (no zombie left)."""
    return not os.path.exists(f"/proc/{pid}")


async def test_stages_in_worker_processes_serve_a_session() -> None:
    spec = make_spec(process=("thinker", "talker", "code2wav"), deadlines=PATIENT)
    async with OmniPipeline(spec) as omni:
        refs = await omni.stages()
        pids = {name: worker_pid(ref) for name, ref in refs.items()}
        assert len(set(pids.values())) == 3
        assert os.getpid() not in pids.values()
        events = await collect(omni.generate(text="hello"))
        metrics = done(events).metrics
        assert text_of(events) == TEXT
        assert samples_of(events) == FULL_AUDIO
        assert metrics.stages["talker"].chunks_in == 9
        assert metrics.stages["code2wav"].outputs == 16
        await assert_nothing_held(omni)
    assert all(reaped(pid) for pid in pids.values()), "a worker outlived the pipeline"


async def test_a_killed_worker_fails_its_session_and_is_restarted() -> None:
    slow = {"per_output_s": 0.1}  # 8 outputs: ~0.8 s of thinking
    spec = make_spec(thinker=slow, process=("talker",), deadlines=PATIENT)
    async with OmniPipeline(spec) as omni:
        talker = (await omni.stages())["talker"]
        first_pid = worker_pid(talker)
        async with omni.session() as victim, omni.session(modalities=("text",)) as bystander:
            for session in (victim, bystander):
                await session.send(text="x", end="finished")
            events: list[Event] = []
            killed = False
            async for event in victim:
                events.append(event)
                if isinstance(event, AudioDelta) and not killed:
                    # The first audio is out: the session is mid-stream on the talker.
                    assert kill_worker(talker) == first_pid  # SIGKILL
                    killed = True
            text_events = [e async for e in bystander]
        error = error_of(events)
        assert (error.code, error.stage) == ("stage_failed", "talker"), error
        assert "WorkerDiedError" in error.message
        assert 0 < samples_of(events) < FULL_AUDIO
        assert text_of(text_events) == TEXT  # the local thinker carried on
        done(text_events)

        # The orchestrator restarts the talker in a fresh worker; the session after that
        # is served in full.
        await omni.inspect(timeout=60)  # answered once the new worker is up
        second_pid = worker_pid(talker)
        assert second_pid != first_pid
        assert reaped(first_pid)
        after = await collect(omni.generate(text="x"))
        done(after)
        assert samples_of(after) == FULL_AUDIO
        assert text_of(after) == TEXT
        await assert_nothing_held(omni)
    assert reaped(second_pid), "the restarted worker outlived the pipeline"
