"""Overlapping segments of a resumable session: the caller ends segment 1 while the
last stage still produces segment 0's audio. Each segment's reply holds only its own
events, ends with its own ``ResponseDone`` (in order, once each) and reports metrics
measured from its own start."""

from __future__ import annotations

import asyncio

from pipeline_helpers import assert_nothing_held, make_spec, samples_of, text_of

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Session
from omni_actors.protocols.events import AudioDelta, Done, Event, ResponseDone, TextDelta

# code2wav takes 16 x 50 ms for a segment's audio; the thinker answers in ~15 ms.
SLOW_CODE2WAV = {"first_output_s": 0.05, "per_output_s": 0.05}
TEXT = "".join(f"t{k} " for k in range(8))  # one segment's text (8 thinker outputs)
SAMPLES = 8 * 2 * 240  # one segment's audio (16 code2wav outputs of 240 samples)
WAIT_S = 10.0  # far beyond a segment's ~0.8 s; the session's own deadline is larger


async def reply(session: Session) -> list[Event]:
    """One segment's events, through its ResponseDone (or the terminal event)."""
    async with asyncio.timeout(WAIT_S):
        return [e async for e in session.events()]


async def test_a_segment_sent_while_the_last_one_is_still_voiced_is_answered_apart() -> None:
    spec = make_spec(code2wav=SLOW_CODE2WAV, deadlines={"total_s": 60.0})
    async with OmniPipeline(spec) as omni:
        async with omni.session() as session:
            await session.send(text="first")
            await session.send(end="segment")
            first: list[Event] = []
            async with asyncio.timeout(WAIT_S):
                async for event in session.events():
                    first.append(event)
                    if isinstance(event, AudioDelta):
                        break  # segment 0 is being voiced: send segment 1 now
            await session.send(text="second")
            await session.send(end="segment")
            first += await reply(session)
            assert isinstance(first[-1], ResponseDone), first[-3:]
            assert first[-1].segment == 0
            assert text_of(first) == TEXT  # nothing of segment 1 in segment 0's reply
            second = await reply(session)
            await session.finish()
            last = await reply(session)

        segment_ends = [e for e in first + second if isinstance(e, ResponseDone)]
        assert [e.segment for e in segment_ends] == [0, 1], segment_ends
        assert first[-1] is segment_ends[0]
        assert second[-1] is segment_ends[1]
        for events in (first, second):
            assert text_of(events) == TEXT
            assert samples_of(events) == SAMPLES
            end = events[-1]
            assert isinstance(end, ResponseDone)
            metrics = end.metrics
            assert metrics.audio_s == SAMPLES / 24000
            assert metrics.stages["thinker"].outputs == 8
            assert metrics.stages["code2wav"].outputs == 16
            assert metrics.ttft_ms is not None
            assert metrics.ttfa_ms is not None
            assert 0 < metrics.ttft_ms < metrics.ttfa_ms <= metrics.e2e_ms
        # The segments did overlap: segment 1's first text reached the session before
        # segment 0 was done (each time counts from its own segment's start).
        starts = session.channel.starts
        m0, m1 = segment_ends[0].metrics, segment_ends[1].metrics
        assert m1.ttft_ms is not None
        assert m1.ttfa_ms is not None
        assert starts[1] + m1.ttft_ms / 1e3 < starts[0] + m0.e2e_ms / 1e3
        # Segment 1's audio waited for code2wav to finish segment 0, and is timed from
        # segment 1's own start, not segment 0's.
        assert starts[1] + m1.ttfa_ms / 1e3 >= starts[0] + m0.e2e_ms / 1e3 - 0.05
        assert isinstance(last[-1], Done)
        assert not [e for e in last if isinstance(e, TextDelta | AudioDelta)]
        await assert_nothing_held(omni)
