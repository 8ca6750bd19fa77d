"""Hostile input through the library: each wrong input fails the call that sent it with
a typed error and loses nothing (the session goes on and answers), floods meet
backpressure or a clear error with bounded memory, and storms of opens and aborts leave
nothing held."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch
from pipeline_helpers import assert_nothing_held, collect, done, make_spec, text_of

from omni_actors.actors.stage.flow import BackpressureError
from omni_actors.errors import InvalidRequestError
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.session_input import SessionClosedError
from omni_actors.protocols.events import Aborted, Event, ResponseDone, SessionError

RATE = 16000
PROCESS = [pytest.param((), id="in-process"), pytest.param(("thinker",), id="worker")]


async def answered(session: Session) -> list[Event]:
    """Respond to the conversation so far; the response's events (it must complete)."""
    response = await session.respond()
    events = await asyncio.wait_for(collect(session.events()), 30)
    last = events[-1]
    assert isinstance(last, ResponseDone), events[-3:]
    assert last.status == "completed", last
    assert last.response == response.id
    return events


HOSTILE_SENDS: dict[str, dict[str, object]] = {
    "nan audio": {"audio": torch.tensor([0.1, float("nan"), 0.2])},
    "inf audio": {"audio": torch.tensor([0.1, float("inf")])},
    "stereo audio": {"audio": torch.zeros(2, 320)},
    "int32 audio": {"audio": torch.zeros(320, dtype=torch.int32)},
    "audio not a tensor": {"audio": [0.0, 0.1]},
    "odd pcm16 bytes": {"audio": b"\x00\x01\x02"},
    "an odd memoryview": {"audio": memoryview(bytearray(5))},
    "a strided memoryview": {"audio": memoryview(bytes(8))[::2]},
    "int32 numpy audio": {"audio": np.zeros(320, dtype=np.int32)},
    "stereo numpy audio": {"audio": np.zeros((2, 320), dtype=np.float32)},
    "nan numpy audio": {"audio": np.array([0.1, np.nan], dtype=np.float64)},
    "object numpy audio": {"audio": np.array([0.1, None])},
    "bytes text": {"text": b"hello"},
    "an int field": {"fields": {"hidden": 5}},
    "a field the entry stage does not take": {"fields": {"nonsense": torch.zeros(3)}},
    "a meta tensor": {"fields": {"hidden": torch.empty(3, device="meta")}},
    "a sparse tensor": {"fields": {"hidden": torch.eye(3).to_sparse()}},
    "too many dimensions": {"fields": {"hidden": torch.zeros([1] * 33)}},
    "a rate no session takes": {"audio": torch.zeros(320), "sample_rate": 7},
    "a rate beyond any microphone": {"audio": torch.zeros(320), "sample_rate": 10**9},
    "a float rate": {"audio": torch.zeros(320), "sample_rate": 44100.0},
    "a sample rate and no audio": {"text": "x", "sample_rate": RATE},
}


@pytest.mark.parametrize("process", PROCESS)
async def test_each_hostile_send_is_refused_and_the_session_answers_after(
    process: tuple[str, ...],
) -> None:
    async with OmniPipeline(make_spec(process=process)) as omni:
        async with omni.session() as session:
            for label, send in HOSTILE_SENDS.items():
                with pytest.raises(InvalidRequestError):
                    await session.send(**send)  # type: ignore[arg-type]
                assert not session.ended, label
            await session.send(text="hello there")
            assert text_of(await answered(session))
        await assert_nothing_held(omni)


async def test_a_gigabyte_of_text_is_refused_before_it_is_queued() -> None:
    huge = "x" * (1 << 30)
    async with OmniPipeline(make_spec(process=("thinker",))) as omni:
        async with omni.session() as session:
            with pytest.raises(InvalidRequestError, match="max_send_bytes"):
                await session.send(text=huge)
            del huge
            await session.send(text="a short one")
            assert text_of(await answered(session))
        await assert_nothing_held(omni)


async def test_empty_input_is_answered() -> None:
    async with OmniPipeline(make_spec()) as omni:
        async with omni.session() as session:
            await session.send()
            await session.send(text="")
            await session.send(audio=torch.zeros(0))
            await session.send(audio=torch.zeros(0, dtype=torch.int16), sample_rate=48000)
            await answered(session)
        done(await collect(omni.generate(text="")))
        await assert_nothing_held(omni)


async def test_ten_thousand_sends_without_reading_meet_backpressure() -> None:
    spec = make_spec(deadlines={"inter_chunk_s": 0.5})
    async with OmniPipeline(spec) as omni:
        session = omni.session()
        assert await session.open() is None
        refused: Exception | None = None
        for _ in range(10_000):
            try:
                await session.send(text="more", end="segment")  # a reply each, never read
            except (BackpressureError, SessionClosedError) as exc:
                refused = exc
                break
        assert refused is not None, "10,000 sends were all taken with nobody reading"
        # What waits for the caller stayed within the output stages' windows (a chunk
        # makes at most two events), plus the replies that ended within them.
        outputs = len({spec.outputs.text, spec.outputs.audio} - {None})
        window = spec.flow.window
        assert session.channel.queued <= 2 * window * outputs + window, session.channel.queued
        events = await collect(session)
        assert isinstance(events[-1], SessionError)
        assert events[-1].code == "backpressure"
        await session.close()
        await assert_nothing_held(omni)
        done(await collect(omni.generate(text="still serving")))


async def test_ten_thousand_concurrent_opens_are_refused_at_admission_without_a_hang() -> None:
    # The four admitted sessions' prewarms share the event loop with 10,000 opens: on two
    # busy cores that can take seconds, so the deadline is generous.
    spec = make_spec(deadlines={"admission_s": 10.0})
    async with OmniPipeline(spec, max_sessions=4) as omni:
        sessions = [omni.session() for _ in range(10_000)]
        results = await asyncio.wait_for(asyncio.gather(*(s.open() for s in sessions)), 120)
        admitted = [s for s, r in zip(sessions, results, strict=True) if r is None]
        refused = [r for r in results if r is not None]
        assert len(admitted) == 4
        assert {r.code for r in refused} == {"admission"}
        for session in sessions:
            if session not in admitted:
                await session.close()
        for session in admitted:
            await session.finish()
            done(await collect(session))
            await session.close()
        await assert_nothing_held(omni)
        done(await collect(omni.generate(text="after the storm")))


async def test_an_abort_storm_leaves_nothing_held_and_the_pipeline_serving() -> None:
    rng = random.Random(7)

    async def one(omni: OmniPipeline, n: int) -> Event:
        async with omni.session() as session:
            await session.send(text=f"turn {n}")
            response = await session.respond()
            if rng.random() < 0.5:  # wait for some of the reply first
                async for _ in session.events():
                    if rng.random() < 0.3:
                        break
            if rng.random() < 0.3:
                await response.cancel()
            aborts = [session.abort(f"storm {n}") for _ in range(rng.randint(1, 3))]
            await asyncio.gather(*aborts)
            events = await collect(session)
            return events[-1]

    async with OmniPipeline(make_spec(process=("talker",)), max_sessions=16) as omni:
        ends = await asyncio.wait_for(asyncio.gather(*(one(omni, n) for n in range(48))), 120)
        assert all(isinstance(e, Aborted) for e in ends), [type(e).__name__ for e in ends]
        await assert_nothing_held(omni)
        done(await collect(omni.generate(text="after the storm")))
