"""Sessions end to end on scripted stages: prewarm, stream vs full edges, text-only
requests, resumable segments and the metrics a session reports."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from pipeline_helpers import assert_nothing_held, collect, done, make_spec, samples_of, text_of

from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session_input import SessionClosedError
from omni_actors.protocols.control import Prewarm
from omni_actors.protocols.events import AudioDelta, Done, ResponseDone, TextDelta
from omni_actors.protocols.stage import INPUT, Chunk
from omni_actors.testing import ActorTestKit

PREWARMS: dict[str, int] = {}
CHUNKS: dict[str, int] = {}


class CountingStage(StageActor):
    """Counts the prewarms and chunks each stage receives."""

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Prewarm):
            PREWARMS[self.name] = PREWARMS.get(self.name, 0) + 1
        if isinstance(message, Chunk):
            CHUNKS[self.name] = CHUNKS.get(self.name, 0) + 1
        return await super().receive(message)


def counting() -> dict[str, type[StageActor]]:
    PREWARMS.clear()
    CHUNKS.clear()
    return {name: CountingStage for name in ("thinker", "talker", "code2wav")}


CALLER_AUDIO: dict[int, int] = {}  # audio samples the entry stage took from the caller, by segment


class AudioCountingStage(StageActor):
    """Counts the caller's audio samples the entry stage receives, per segment."""

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Chunk) and message.source == INPUT:
            audio = message.tensors.get("audio")
            if audio is not None:
                CALLER_AUDIO[message.segment] = CALLER_AUDIO.get(message.segment, 0) + audio.numel()
        return await super().receive(message)


async def test_text_and_audio_stream_then_done_with_metrics() -> None:
    async with OmniPipeline(make_spec()) as omni:
        events = await collect(omni.generate(text="hello"))
        metrics = done(events).metrics
        assert text_of(events) == "".join(f"t{k} " for k in range(8))
        # 8 thinker outputs x 2 talker frames x 1 audio output of 240 samples each
        assert samples_of(events) == 8 * 2 * 240
        assert metrics.ttft_ms is not None
        assert metrics.ttfa_ms is not None
        assert 0 < metrics.ttft_ms <= metrics.e2e_ms
        assert metrics.ttft_ms < metrics.ttfa_ms <= metrics.e2e_ms
        assert metrics.audio_s == pytest.approx(16 * 240 / 24000)
        assert metrics.rtf is not None
        assert metrics.rtf > 0
        assert list(metrics.stages) == ["thinker", "talker", "code2wav"]
        thinker, talker, code2wav = (metrics.stages[n] for n in ("thinker", "talker", "code2wav"))
        assert thinker.outputs == 8
        assert talker.outputs == 16
        assert code2wav.outputs == 16
        assert thinker.hops["talker"].chunks == 9  # 8 outputs + the end marker
        assert thinker.hops["client"].chunks == 8
        # 16 frames through (initial 4, frames 6) = 4 + 6 + 6 exactly, so nothing is left
        # at the end: a bare end marker follows (never a re-sent boundary chunk)
        assert talker.hops["code2wav"].chunks == 4
        assert code2wav.hops["client"].bytes == 16 * 240 * 4
        assert thinker.compute_ms >= 5
        assert code2wav.compute_ms > 0
        # Per hop: the worst wait of one chunk bounds the mean; host stages copy nothing.
        for stage in (talker, code2wav):
            assert stage.queue_wait_ms / stage.chunks_in <= stage.queue_wait_max_ms
            assert stage.queue_wait_max_ms <= stage.queue_wait_ms
        assert all(
            hop.copy_wait_ms == 0 for s in metrics.stages.values() for hop in s.hops.values()
        )
        # How smoothly the audio came, as a player 200 ms behind would have heard it.
        pacing = metrics.pacing
        assert pacing is not None
        audio_deltas = [e for e in events if isinstance(e, AudioDelta)]
        assert pacing.deltas == len(audio_deltas) > 1
        assert pacing.jitter_buffer_ms == 200
        assert pacing.gap_max_ms is not None
        assert 0 <= pacing.gap_max_ms <= metrics.e2e_ms
        assert pacing.underruns >= 0
        assert (pacing.stall_ms > 0) == (pacing.underruns > 0)
        await assert_nothing_held(omni)


async def test_every_stage_is_prewarmed_before_any_input() -> None:
    async with OmniPipeline(make_spec(), stage_classes=counting()) as omni:
        session = omni.session()
        async with session:
            assert PREWARMS == {"thinker": 1, "talker": 1, "code2wav": 1}
            assert CHUNKS == {}
            held = await omni.inspect()
            # stages know a session by its key: the id plus an admission count
            assert all(state.keys == [f"{session.id}#1"] for state in held.values())
            await session.send(text="hi")
            await session.finish()
            events = [e async for e in session]
        done(events)
        await assert_nothing_held(omni)


async def test_stream_edges_send_audio_while_the_thinker_still_decodes() -> None:
    slow = {"per_output_s": 0.02, "outputs": 10}
    async with OmniPipeline(make_spec(thinker=slow)) as omni:
        events = await collect(omni.generate(text="x"))
    kinds = [type(e) for e in events]
    first_audio = kinds.index(AudioDelta)
    last_text = len(kinds) - 1 - kinds[::-1].index(TextDelta)
    assert first_audio < last_text, "audio must start before the thinker finishes"


async def test_full_edges_wait_for_the_whole_upstream_and_make_the_same_audio() -> None:
    async with OmniPipeline(make_spec(mode="full")) as omni:
        full = await collect(omni.generate(text="x"))
    async with OmniPipeline(make_spec()) as omni:
        stream = await collect(omni.generate(text="x"))
    kinds = [type(e) for e in full]
    last_text = len(kinds) - 1 - kinds[::-1].index(TextDelta)
    assert last_text < kinds.index(AudioDelta)
    assert samples_of(full) == samples_of(stream) == 16 * 240
    metrics = done(full).metrics
    assert metrics.stages["thinker"].hops["talker"].chunks == 1  # one payload
    assert metrics.stages["talker"].hops["code2wav"].chunks == 1
    assert metrics.stages["talker"].chunks_in == 1


async def test_full_edge_payload_follows_the_receivers_accumulate_rules() -> None:
    # Both ends declare the edge's fields as replaced (an edge's two rules must agree).
    replaced = {"replace": ["hidden", "token_ids"]}
    spec = make_spec(mode="full", thinker=replaced, talker=replaced)
    assert spec.accumulate("talker")["hidden"] == "replace"
    async with OmniPipeline(spec) as omni:
        events = await collect(omni.generate(text="x"))
    # The payload keeps only the last output's row: the talker sees 1 row, not 8, and
    # speaks 2 frames instead of 16.
    assert samples_of(events) == 2 * 240


async def test_text_only_requests_never_touch_audio_stages() -> None:
    async with OmniPipeline(make_spec(), stage_classes=counting()) as omni:
        events = await collect(omni.generate(text="x", modalities=("text",)))
        metrics = done(events).metrics
        assert not any(isinstance(e, AudioDelta) for e in events)
        assert text_of(events)
        assert metrics.ttfa_ms is None
        assert metrics.rtf is None
        assert list(metrics.stages) == ["thinker"]
        assert metrics.stages["thinker"].hops == {
            "client": metrics.stages["thinker"].hops["client"]
        }
        assert set(PREWARMS) == {"thinker"}
        assert set(CHUNKS) == {"thinker"}
        await assert_nothing_held(omni)


async def test_audio_only_requests_still_run_the_thinker_but_emit_no_text() -> None:
    async with OmniPipeline(make_spec()) as omni:
        events = await collect(omni.generate(audio=torch.zeros(1600), modalities=("audio",)))
        assert not any(isinstance(e, TextDelta) for e in events)
        assert samples_of(events) == 16 * 240
        assert done(events).metrics.ttft_ms is None


async def test_resumable_session_answers_each_segment_and_prewarms_once() -> None:
    async with OmniPipeline(make_spec(), stage_classes=counting()) as omni:
        async with omni.session() as session:
            replies = []
            for segment in range(3):
                await session.send(audio=torch.zeros(800))
                await session.send(audio=torch.zeros(800))
                if segment < 2:
                    await session.end_segment()
                else:
                    await session.finish()
                replies.append([e async for e in session.events()])
            assert not session.ended or isinstance(session.channel.terminal, Done)
        for segment, reply in enumerate(replies[:2]):
            assert isinstance(reply[-1], ResponseDone)
            assert reply[-1].segment == segment
            assert samples_of(reply) == 16 * 240
            assert text_of(reply)
            assert reply[-1].metrics.ttfa_ms is not None
            assert reply[-1].metrics.ttfa_ms > 0
        assert isinstance(replies[2][-1], Done)
        assert samples_of(replies[2]) == 16 * 240
        assert PREWARMS == {"thinker": 1, "talker": 1, "code2wav": 1}
        with pytest.raises(SessionClosedError):
            await session.send(text="too late")
        await assert_nothing_held(omni)


async def test_a_segment_with_no_input_yields_no_reply() -> None:
    async with OmniPipeline(make_spec()) as omni:
        async with omni.session() as session:
            await session.send(text="hi")
            await session.end_segment()
            first = [e async for e in session.events()]
            await session.finish()  # nothing new: the session just ends
            last = [e async for e in session.events()]
        assert samples_of(first) == 16 * 240
        assert isinstance(last[-1], Done)
        assert samples_of(last) == 0
        assert not text_of(last)


async def test_respond_sends_the_end_of_resampled_audio_with_its_segment() -> None:
    CALLER_AUDIO.clear()
    async with OmniPipeline(make_spec(), stage_classes={"thinker": AudioCountingStage}) as omni:
        async with omni.session() as session:
            tone = torch.sin(torch.arange(24000) / 10.0)  # 1 s at 24 kHz; the pipeline takes 16
            for piece in torch.split(tone, 480):
                await session.send(audio=piece, sample_rate=24000)
            await session.respond()  # no commit: respond ends the caller's stream
            first = [e async for e in session.events()]
            await session.finish()  # nothing new: the session just ends
            last = [e async for e in session.events()]
        assert CALLER_AUDIO == {0: 16000}, "the whole second, in the segment it was sent in"
        assert samples_of(first) == 16 * 240
        assert isinstance(last[-1], Done)
        assert samples_of(last) == 0, "finish answered the end of the last utterance again"
        assert not text_of(last)


async def test_many_sessions_run_concurrently_on_one_pipeline() -> None:
    async with OmniPipeline(make_spec()) as omni:
        results = await asyncio.gather(*(collect(omni.generate(text="x")) for _ in range(20)))
        assert all(samples_of(done_events) == 16 * 240 for done_events in results)
        assert len({e[-1].session for e in results}) == 20
        await assert_nothing_held(omni)


async def test_duplicate_session_ids_are_refused() -> None:
    async with OmniPipeline(make_spec()) as omni:
        async with omni.session(session_id="s1"):
            events = await collect(omni.generate(text="x", session_id="s1"))
        assert events[-1].code == "admission"  # type: ignore[union-attr]
        assert "already in use" in events[-1].message  # type: ignore[union-attr]


async def test_bad_modalities_are_a_usage_error() -> None:
    async with OmniPipeline(make_spec()) as omni:
        with pytest.raises(ValueError, match="modalities"):
            omni.session(modalities=("video",))  # type: ignore[arg-type]


async def test_replicas_share_sessions_and_each_serves_whole_sessions() -> None:
    spec = make_spec()
    stages = tuple(
        s.model_copy(update={"replicas": 2}) if s.name == "talker" else s for s in spec.stages
    )
    async with OmniPipeline(spec.model_copy(update={"stages": stages})) as omni:
        assert sorted(await omni.stages()) == ["code2wav", "talker-0", "talker-1", "thinker"]
        async with omni.session() as a, omni.session() as b:
            live = await omni.live_sessions()
            assert sorted(live["talker-0"] + live["talker-1"]) == sorted([a.id, b.id])
            assert live["talker-0"], "the least loaded replica takes the next session"
            assert live["talker-1"], "the least loaded replica takes the next session"
            for session in (a, b):
                await session.send(text="x")
                await session.finish()
            for session in (a, b):
                assert samples_of([e async for e in session]) == 16 * 240
        await assert_nothing_held(omni)


async def test_a_stopped_pipeline_answers_new_sessions_with_an_error() -> None:
    async with ActorTestKit() as kit, OmniPipeline(make_spec(), system=kit.system) as omni:
        await kit.system.stop(omni.orchestrator)
        events = await collect(omni.generate(text="x"))
    assert events[-1].code == "internal"  # type: ignore[union-attr]


async def test_a_stage_that_cannot_start_fails_the_pipeline_start_cleanly() -> None:
    from omni_actors.actors.engines.registry import EngineArgsError

    spec = make_spec()
    # Validation refuses such args when the spec is made; the stage checks them again
    # when it builds its engine, as a spec may be copied and changed after validation.
    talker = spec.stages[1]
    engine = talker.engine.model_copy(update={"args": {"no_such_setting": 1}})
    stages = (spec.stages[0], talker.model_copy(update={"engine": engine}), spec.stages[2])
    spec = spec.model_copy(update={"stages": stages})
    with pytest.raises(EngineArgsError, match=r"stages\[talker\]\.engine\.args\.no_such_setting"):
        async with OmniPipeline(spec):
            pass
    # the other stages, started concurrently, were stopped: the suite's leak checks
    # (tasks, child processes) run after this test
