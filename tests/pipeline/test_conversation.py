"""The conversation model of ``Session``: commit, clear, respond, cancel, truncate.

Driven through a pipeline of two small engines that keep a conversation
(``conversation_engines``): ``TurnEcho`` replies with the user turns since its last
reply and, asked ``?``, with the whole history it holds, which is how these tests read
what every stage kept.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest
import torch
from conversation_engines import TurnEcho

from omni_actors.errors import InvalidRequestError
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.protocols.events import (
    AudioDelta,
    Event,
    ResponseDone,
    TextDelta,
)
from omni_actors.testing import eventually
from omni_actors.testing.inspection import actor_instance

SAMPLE_RATE = 1000  # 100 samples per character: 100 ms each


def spec(*, process: bool = False, echo: str = "TurnEcho") -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "conversation",
            "stages": [
                {"name": "echo", "engine": {"kind": f"conversation_engines:{echo}"}},
                {
                    "name": "speaker",
                    "process": process,
                    "engine": {"kind": "conversation_engines:Speaker"},
                },
            ],
            "edges": [{"from": "echo", "to": "speaker"}],
            "outputs": {"text": "echo", "audio": "speaker", "sample_rate": SAMPLE_RATE},
            "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
        }
    )


@asynccontextmanager
async def conversation(*, process: bool = False, echo: str = "TurnEcho") -> AsyncIterator[Session]:
    async with OmniPipeline(spec(process=process, echo=echo)) as omni, omni.session() as session:
        yield session


async def reply(session: Session, **options: object) -> tuple[str, list[Event], ResponseDone]:
    response = await session.respond(**options)  # type: ignore[arg-type]
    events = [event async for event in response.events()]
    done = events[-1]
    assert isinstance(done, ResponseDone), events
    assert done.response == response.id
    assert all(getattr(e, "response", response.id) == response.id for e in events)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, events, done


async def history(session: Session) -> str:
    await session.send(text="?")
    text, _, done = await reply(session)
    assert done.status == "completed"
    return text


async def test_commits_make_turns_and_clear_drops_the_uncommitted_input() -> None:
    async with conversation() as session:
        await session.send(text="ab")
        await session.commit()
        await session.send(text="c")
        await session.send(text="d")
        await session.clear()
        await session.send(text="ef")
        text, events, done = await reply(session)
        assert text == "AB|EF"
        assert done.status == "completed"
        samples = sum(e.audio.numel() for e in events if isinstance(e, AudioDelta))
        assert samples == 5 * 100
        assert done.metrics.audio_s == pytest.approx(0.5)
        # A reply to the conversation so far, with nothing new said.
        assert (await reply(session))[0] == ""
        assert await history(session) == "u:ab u:ef a:AB|EF a:"


async def test_one_response_in_flight() -> None:
    async with conversation() as session:
        await session.send(text="hello")
        first = await session.respond()
        with pytest.raises(InvalidRequestError, match="in flight"):
            await session.respond()
        with pytest.raises(InvalidRequestError, match="in flight"):
            await session.truncate(audio_ms=10)
        assert isinstance(await first.wait(), ResponseDone)
        await session.send(text="again")
        assert (await reply(session))[0] == "AGAIN"


async def test_a_cancelled_response_stops_and_the_conversation_keeps_what_was_said() -> None:
    async with conversation() as session:
        await session.send(text="a long answer to cut")
        response = await session.respond()
        seen = ""
        async for event in response.events():
            if isinstance(event, TextDelta):
                seen += event.text
                if len(seen) == 3:
                    assert await response.cancel()
        done = response.done
        assert isinstance(done, ResponseDone)
        assert done.status == "cancelled"
        assert seen.startswith("A L")
        assert len(seen) < len("A LONG ANSWER TO CUT")
        assert not await response.cancel()  # already over
        kept = (await history(session)).split(" a:", 1)[1]
        # The engine keeps what it yielded: what the caller saw, and at most the outputs
        # that were on their way when the cancel landed.
        assert kept.startswith(seen), kept
        assert len(kept) <= len(seen) + 2, kept
        await session.send(text="next")
        assert (await reply(session))[0] == "NEXT"


async def test_a_cancel_never_cuts_the_user_turn_an_entry_engine_is_reading() -> None:
    """An entry engine that yields while it reads its input (a thinker sending a turn's
    rows ahead) is stopped only once it has read the whole input: the turn stays whole."""
    async with conversation(echo="AheadEcho") as session:
        for char in "abcdef":
            await session.send(text=char)
        response = await session.respond()
        assert await response.cancel()  # lands while the engine still reads the turn
        done = await response.wait()
        assert isinstance(done, ResponseDone)
        assert done.status == "cancelled"
        assert (await history(session)).startswith("u:abcdef a:")


async def test_after_cancel_returns_the_response_yields_no_delta() -> None:
    async with conversation() as session:
        await session.send(text="a long answer to cut")
        response = await session.respond()
        # Deltas pile up unread, as they do for a caller busy playing audio.
        await eventually(lambda: session.channel.queued >= 4, what="deltas queued")
        assert await response.cancel()
        rest = [event async for event in response.events()]
        assert [type(event) for event in rest] == [ResponseDone], rest
        assert isinstance(rest[0], ResponseDone)
        assert rest[0].status == "cancelled"


async def test_a_reader_in_another_task_gets_no_delta_once_cancel_is_called() -> None:
    async with conversation() as session:
        await session.send(text="a long answer to cut")
        response = await session.respond()
        cancelling = False
        read: list[tuple[Event, bool]] = []
        gate = asyncio.Event()

        async def reader() -> None:  # as a server's sender task: busy after two deltas
            async for event in session:
                read.append((event, cancelling))
                if len(read) == 2:
                    await gate.wait()
                if isinstance(event, ResponseDone):
                    return

        loop = asyncio.get_running_loop()
        task = loop.create_task(reader())
        try:
            await eventually(lambda: len(read) == 2 and session.channel.queued >= 4)
            cancelling = True
            # The cancel's first step runs before the reader wakes (callbacks run in
            # the order they were scheduled): the reader reads on while it is under way.
            cancel = loop.create_task(response.cancel())
            gate.set()
            assert await asyncio.wait_for(cancel, 10)
            await asyncio.wait_for(task, 10)
        finally:
            task.cancel()
        late = [e for e, after in read if after and isinstance(e, TextDelta | AudioDelta)]
        assert late == []
        assert isinstance(read[-1][0], ResponseDone)


async def test_the_session_takes_the_next_call_as_soon_as_cancel_returns() -> None:
    async with conversation() as session:
        await session.send(text="a long answer to cut")
        response = await session.respond()
        await eventually(lambda: session.channel.queued >= 1, what="a delta queued")
        assert await response.cancel()
        # Nothing read since: the cancelled response's ResponseDone is still queued.
        await session.truncate(audio_ms=0)
        await session.send(text="next")
        text, _, done = await reply(session)
        assert (text, done.status) == ("NEXT", "completed")
        assert not await response.cancel()  # over


async def test_a_failed_response_keeps_the_session_and_rolls_back() -> None:
    async with conversation() as session:
        await session.send(text="fail")
        _, _, done = await reply(session)
        assert done.status == "failed"
        assert (done.code, done.stage) == ("engine_error", "echo")
        assert "on purpose" in done.message
        assert not session.ended
        await session.send(text="fine")
        assert (await reply(session))[0] == "FINE"
        assert await history(session) == "u:fine a:FINE"


async def test_truncate_cuts_every_stage_to_what_was_heard() -> None:
    async with conversation() as session:
        with pytest.raises(InvalidRequestError, match="no response"):
            await session.truncate(audio_ms=100)
        await session.send(text="abcdef")
        assert (await reply(session))[0] == "ABCDEF"
        heard = await session.truncate(audio_ms=250)  # 2.5 characters heard: 3 kept
        assert heard == "ABC"  # the reply's text as heard, as the stages keep it
        assert await history(session) == "u:abcdef a:ABC"
        with pytest.raises(InvalidRequestError, match="audio_ms"):
            await session.truncate(audio_ms=-1)


async def test_options_reach_the_engine_and_bad_ones_are_refused() -> None:
    async with conversation() as session:
        await session.send(text="abcdef")
        assert (await reply(session, max_tokens=2))[0] == "AB"
        for bad in ({"max_tokens": 0}, {"temperature": -1.0}, {"voice": ""}, {"instructions": 3}):
            with pytest.raises(InvalidRequestError):
                await session.respond(**bad)  # type: ignore[arg-type]
        # TurnEcho takes no instructions: a response cannot have its own.
        with pytest.raises(InvalidRequestError, match="takes no instructions"):
            await session.respond(instructions="be brief")
        await session.send(text="x")
        assert (await reply(session))[0] == "X"


async def test_cancel_and_truncate_cross_a_worker_process() -> None:
    async with conversation(process=True) as session:
        await session.send(text="abcdef")
        assert (await reply(session))[0] == "ABCDEF"
        await session.truncate(audio_ms=100)
        assert await history(session) == "u:abcdef a:A"
        await session.send(text="a long answer to cut")
        response = await session.respond()
        async for event in response.events():
            if isinstance(event, TextDelta):
                await response.cancel()
        assert isinstance(response.done, ResponseDone)
        assert response.done.status == "cancelled"


async def test_audio_at_the_callers_rate_is_resampled_as_one_stream() -> None:
    async with OmniPipeline(spec()) as omni, omni.session() as session:
        echo = actor_instance((await omni.stages())["echo"]).engine
        assert isinstance(echo, TurnEcho)
        tone = torch.sin(2 * math.pi * 440 * torch.arange(24000) / 24000)
        pcm = (tone * 32767).to(torch.int16)
        for piece in torch.split(pcm, 480):  # 20 ms frames of 24 kHz PCM
            await session.send(audio=piece, sample_rate=24000)
        await session.commit()  # sends the stream's last samples
        await session.send(text="hi")
        assert (await reply(session))[0] == "HI"
        heard = torch.cat(echo.audio[next(iter(echo.audio))])
        assert heard.numel() == 16000  # 1 s at the pipeline's 16 kHz
        expected = torch.sin(2 * math.pi * 440 * torch.arange(16000) / 16000)
        assert torch.allclose(heard[200:-200], expected[200:-200], atol=2e-3)
        with pytest.raises(InvalidRequestError, match="int16"):
            await session.send(audio=torch.zeros(4, dtype=torch.int32))
        with pytest.raises(InvalidRequestError, match="1-D"):
            await session.send(audio=torch.zeros(2, 4))
        with pytest.raises(InvalidRequestError, match="sample_rate"):
            await session.send(audio=torch.zeros(4), sample_rate=0)


async def test_audio_as_numpy_arrays_and_pcm16_bytes_reaches_the_entry_stage() -> None:
    pcm = np.array([0, 16384, -16384, 32767, -32768], dtype=np.int16)
    as_float = pcm.astype(np.float64) / 32768.0
    sends: list[object] = [
        as_float.astype(np.float32),
        as_float,  # float64
        pcm,
        pcm.astype(">i2"),  # big-endian int16: the values, not the bytes
        pcm.astype("<i2").tobytes(),
        bytearray(pcm.astype("<i2").tobytes()),
        memoryview(pcm.astype("<i2").tobytes()),
    ]
    async with OmniPipeline(spec()) as omni, omni.session() as session:
        echo = actor_instance((await omni.stages())["echo"]).engine
        assert isinstance(echo, TurnEcho)
        for audio in sends:
            await session.send(audio=audio)  # type: ignore[arg-type]
        reused = as_float.astype(np.float32)
        await session.send(audio=reused)
        reused[:] = 0.0  # a microphone's buffer, refilled after the send
        for bad, match in [
            (b"\x00\x01\x02", "even number of bytes"),
            (np.zeros(4, dtype=np.int32), "int32"),
            (np.zeros((2, 4), dtype=np.float32), "1-D"),
            (np.array([0.1, np.nan], dtype=np.float32), "NaN"),
            ([0.0, 0.1], "numpy array or PCM16 bytes"),
        ]:
            with pytest.raises(InvalidRequestError, match=match):
                await session.send(audio=bad)  # type: ignore[arg-type]
        await session.send(text="hi")
        assert (await reply(session))[0] == "HI"  # nothing lost: the session answers
        heard = echo.audio[next(iter(echo.audio))]
        assert len(heard) == len(sends) + 1
        for piece in heard:
            assert piece.dtype == torch.float32
            np.testing.assert_array_equal(piece.numpy(), as_float.astype(np.float32))


@pytest.mark.parametrize(
    ("max_tokens", "tokens", "reason"), [(None, 5, "length"), (3, 3, "length"), (40, 32, "stop")]
)
async def test_a_reply_cut_at_its_most_tokens_says_length(
    max_tokens: int | None, tokens: int, reason: str
) -> None:
    data = load_pipeline("scripted-omni").model_dump(by_alias=True)
    data["stages"][0]["engine"]["args"]["max_new_tokens"] = 5  # the thinker's own cap
    async with (
        OmniPipeline(PipelineSpec.model_validate(data)) as omni,
        omni.session(modalities=("text",)) as session,
    ):
        await session.send(text="hello")
        done = await (await session.respond(max_tokens=max_tokens)).wait()
        assert isinstance(done, ResponseDone)
        thinker = done.metrics.stages["thinker"]
        assert (thinker.completion_tokens, thinker.finish_reason) == (tokens, reason)
