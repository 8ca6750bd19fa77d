"""A conversation outlives a stage restart: the response in flight fails with
``stage_failed``, the session stays open, and the next input replays the conversation
onto the restarted stages (``omni_actors.pipeline.conversation_log``).

Driven through ``ReplayEcho`` (``conversation_engines``), which replies with the user
turns since its last reply and, asked ``?``, with the whole history it holds: after a
restart, that history must be the one a run without the failure holds.
"""

from __future__ import annotations

import asyncio
import pathlib
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from conversation_engines import SAMPLES_PER_CHAR, ReplayEcho

from omni_actors.actors.stage.actor import StageActor
from omni_actors.errors import InvalidRequestError
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.session_input import SessionClosedError
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.control import Inspect, StageState
from omni_actors.protocols.events import AudioDelta, ResponseDone, SessionError, TextDelta
from omni_actors.testing import eventually, kill_worker, worker_pid
from omni_actors.testing.chunk_faults import ChunkFaults, PipelineFaults
from omni_actors.testing.inspection import actor_instance, blocked_senders, mailbox_room

SECOND = "a long second turn"


def spec(
    *,
    kind: str = "ReplayEcho",
    history_bytes: int | None = None,
    process: bool = True,
    backoff_s: float | None = None,
    max_restarts: int | None = None,
    speaker_hold: pathlib.Path | None = None,
    relay: bool = False,
) -> PipelineSpec:
    """Echo then the speaker; with ``relay``, a ``Relay`` entry before echo (echo still
    holds the conversation and writes the reply, as a cascade's LLM after its
    recognizer)."""
    inputs = {} if history_bytes is None else {"max_history_bytes": history_bytes}
    supervision: dict[str, float] = {}
    if backoff_s is not None:
        supervision["backoff_min_s"] = backoff_s
    if max_restarts is not None:
        supervision["max_restarts"] = max_restarts
    entry = {"name": "relay", "process": process, "engine": {"kind": "conversation_engines:Relay"}}
    return PipelineSpec.model_validate(
        {
            "name": "replay",
            "stages": [
                *([entry] if relay else []),
                {
                    "name": "echo",
                    "process": process,
                    "engine": {"kind": f"conversation_engines:{kind}"},
                },
                {
                    "name": "speaker",
                    "process": process,
                    "engine": {
                        "kind": "conversation_engines:Speaker",
                        "args": {} if speaker_hold is None else {"hold": str(speaker_hold)},
                    },
                },
            ],
            "edges": [
                *([{"from": "relay", "to": "echo"}] if relay else []),
                {"from": "echo", "to": "speaker"},
            ],
            "inputs": inputs,
            "supervision": supervision,
            "outputs": {"text": "echo", "audio": "speaker", "sample_rate": 1000},
            "deadlines": {"idle_s": 60.0, "inter_chunk_s": 30.0, "admission_s": 60.0},
        }
    )


@asynccontextmanager
async def conversation(s: PipelineSpec) -> AsyncIterator[tuple[OmniPipeline, Session]]:
    async with OmniPipeline(s) as omni, omni.session() as session:
        yield omni, session


async def reply(
    session: Session,
    kill: str = "",
    omni: OmniPipeline | None = None,
    max_tokens: int | None = None,
) -> tuple[str, int, ResponseDone]:
    """Respond; with ``kill``, SIGKILL that stage's worker at the reply's first text."""
    response = await session.respond(max_tokens=max_tokens)
    text, samples = "", 0
    async for event in response.events():
        if isinstance(event, TextDelta):
            if kill and not text:
                assert omni is not None
                kill_worker((await omni.stages())[kill])
            text += event.text
        elif isinstance(event, AudioDelta):
            samples += event.audio.numel()
    assert isinstance(response.done, ResponseDone)
    return text, samples, response.done


async def history(session: Session) -> str:
    await session.send(text="?")
    text, _, done = await reply(session)
    assert done.status == "completed", done
    return text


async def restarted(omni: OmniPipeline, session: Session, stage: str) -> dict[str, Any]:
    """A first turn answered, then ``stage``'s worker killed, until the session heard of
    it (stale: its next input reopens it); the pipeline's stages."""
    await session.send(text="hello")
    assert (await reply(session))[0] == "HELLO"
    stages = await omni.stages()
    kill_worker(stages[stage])

    async def told() -> None:
        assert session.channel.stale

    await eventually(told)
    return stages


async def two_turns(omni: OmniPipeline, session: Session, kill: str = "") -> str:
    """Turn 1, then turn 2 (its first reply killed by ``kill``, then answered again)."""
    await session.send(text="hello")
    assert (await reply(session))[0] == "HELLO"
    await session.send(text=SECOND)
    if kill:
        before = worker_pid((await omni.stages())[kill])
        _, _, failed = await reply(session, kill, omni)
        assert failed.status == "failed", failed
        assert (failed.code, failed.stage) == ("stage_failed", kill), failed
        assert "WorkerDiedError" in failed.message
        assert not session.ended
        text, samples, done = await reply(session)  # respond again: the turn is committed
        assert worker_pid((await omni.stages())[kill]) != before
    else:
        text, samples, done = await reply(session)
    assert done.status == "completed", done
    assert text == SECOND.upper()
    assert samples == len(SECOND) * SAMPLES_PER_CHAR
    return await history(session)


async def test_without_a_failure() -> None:
    async with conversation(spec()) as (omni, session):
        assert await two_turns(omni, session) == f"u:hello a:HELLO u:{SECOND} a:{SECOND.upper()}"


@pytest.mark.parametrize("kill", ["echo", "speaker"])
async def test_a_killed_stage_costs_the_turn_in_flight_not_the_conversation(kill: str) -> None:
    async with conversation(spec()) as (omni, session):
        expected = f"u:hello a:HELLO u:{SECOND} a:{SECOND.upper()}"
        assert await two_turns(omni, session, kill) == expected
        await session.send(text="third")  # and it goes on
        assert (await reply(session))[0] == "THIRD"


def test_the_replies_kept_are_the_text_stages_if_it_takes_them_back_else_the_entrys() -> None:
    assert spec().reply_stage == "echo"
    assert spec(relay=True).reply_stage == "echo"
    assert spec(kind="TurnEcho", relay=True).reply_stage == "relay"


@pytest.mark.parametrize("kill", ["relay", "echo", "speaker"])
async def test_the_replies_of_a_stage_after_the_entry_are_replayed(kill: str) -> None:
    # The entry passes the conversation on (a cascade's recognizer): echo, the stage
    # that writes the replies, holds it. A restart of any stage replays the replies it
    # wrote, not only the user turns: it does not answer them again.
    async with conversation(spec(relay=True)) as (omni, session):
        expected = f"u:hello a:HELLO u:{SECOND} a:{SECOND.upper()}"
        assert await two_turns(omni, session, kill) == expected
        await session.send(text="third")
        assert (await reply(session))[0] == "THIRD"


async def test_a_reply_the_stage_after_the_entry_failed_is_not_replayed() -> None:
    # Echo fails the reply and rolls its turn back; the entry did not fail: the turn is
    # gone from the conversation, after a restart too.
    async with conversation(spec(relay=True)) as (omni, session):
        await session.send(text="hello")
        assert (await reply(session))[0] == "HELLO"
        await session.send(text="FAIL")
        _, _, failed = await reply(session)
        assert (failed.status, failed.code, failed.stage) == ("failed", "engine_error", "echo")
        kill_worker((await omni.stages())["echo"])

        async def told() -> None:
            assert session.channel.stale

        await eventually(told)
        assert await history(session) == "u:hello a:HELLO"


async def test_a_reply_of_a_stage_after_the_entry_can_be_deleted() -> None:
    async with conversation(spec(relay=True, process=False)) as (_, session):
        assert session.deletes_turns
        await session.send(text="one")
        _, _, first = await reply(session)
        await session.send(text="two")
        await reply(session)
        assert await session.delete(first.response)
        assert await history(session) == "u:one u:two a:TWO"


async def test_an_assistant_turn_the_caller_adds_is_history_and_outlives_a_restart() -> None:
    async with conversation(spec()) as (omni, session):
        await session.send(text="hello")
        await session.add_reply("hi, I am a model")  # commits "hello" first
        await session.send(text="next")
        text, samples, done = await reply(session)
        # The added turn is a reply: only what came after it is answered.
        assert (text, done.status) == ("NEXT", "completed"), done
        assert samples == len("NEXT") * SAMPLES_PER_CHAR  # nothing voiced for the added one
        kill_worker((await omni.stages())["echo"])

        async def told() -> None:
            assert session.channel.stale

        await eventually(told)
        # Replayed onto the restarted stage, the added turn with it.
        assert await history(session) == "u:hello a:hi, I am a model u:next a:NEXT"


async def test_an_assistant_turn_is_refused_by_an_entry_stage_that_cannot_take_one() -> None:
    async with conversation(spec(kind="TurnEcho", process=False)) as (_, session):
        with pytest.raises(InvalidRequestError, match="cannot take an assistant turn"):
            await session.add_reply("hi")
        with pytest.raises(InvalidRequestError, match="must be a str"):
            await session.add_reply(b"hi")  # type: ignore[arg-type]
        await session.send(text="x")  # nothing was sent: the session goes on
        assert (await reply(session))[0] == "X"


async def test_a_target_dying_again_while_the_reopen_waits_for_its_stage_is_waited_for() -> None:
    # Echo's prewarm names its target, the speaker: the reopen sees the speaker up, then
    # waits for echo's restart (a backoff of seconds), and meanwhile the speaker dies
    # too. Echo's prewarm cannot carry the speaker's ref until it is back: it waits.
    async with conversation(spec(backoff_s=3.0)) as (omni, session):
        stages = await restarted(omni, session, "echo")
        sending = asyncio.ensure_future(session.send(text="x"))
        await eventually(lambda: blocked_senders(stages["echo"]))  # the reopen's prewarm
        kill_worker(stages["speaker"])

        async def speaker_restarting() -> None:
            health = (await omni.health()).stages
            assert health["speaker"].state == "restarting"
            assert health["echo"].state != "running"  # the race this test is about

        await eventually(speaker_restarting, timeout=2.0)
        await sending
        text, _, done = await reply(session)
        if done.status == "failed":  # the speaker's death came after the reopen
            assert (done.code, done.stage) == ("stage_failed", "speaker"), done
            text, _, done = await reply(session)
        assert (text, done.status) == ("X", "completed"), done
        assert await history(session) == "u:hello a:HELLO u:x a:X"


async def test_a_stage_dying_as_the_session_reopens_reopens_it_again() -> None:
    # The speaker dies while the session reopens (its prewarm waits for echo's restart):
    # the session actor hears of it right after the reopen, before the caller's replay
    # and input go out under the key it just lost. They go under the next one, and the
    # response is answered; sent under the lost key, its ResponseDone never came.
    async with conversation(spec(backoff_s=3.0)) as (omni, session):
        stages = await restarted(omni, session, "echo")
        # The first input after the restart ends the turn: nothing sent after it could
        # reopen the session.
        sending = asyncio.ensure_future(session.send(text="x", end="segment"))
        await eventually(lambda: blocked_senders(stages["echo"]))  # the reopen's prewarm
        kill_worker(stages["speaker"])

        async def speaker_failed_first() -> None:
            health = (await omni.health()).stages
            assert health["speaker"].restarts == 1  # the session actor has been told
            assert health["echo"].state != "running"  # so the reopen is still under way

        await eventually(speaker_failed_first, timeout=2.0)
        await sending
        response = session.response
        assert response is not None
        text = ""
        async with asyncio.timeout(60):
            async for event in response.events():
                if isinstance(event, TextDelta):
                    text += event.text
        assert isinstance(response.done, ResponseDone)
        assert (text, response.done.status) == ("X", "completed"), response.done
        assert await history(session) == "u:hello a:HELLO u:x a:X"


async def test_input_on_its_way_to_a_dead_entry_stage_goes_again_after_the_reopen() -> None:
    # The caller's input waits for echo's restart (its worker died) before the session
    # actor, busy with a truncate that a frozen speaker holds up, hears of the death:
    # the cut comes while the input waits, so it goes out under the key the stages
    # dropped. It must go again under the reopened session's key, or its response
    # never ends.
    async with conversation(spec(backoff_s=3.0)) as (omni, session):
        await session.send(text="hello")
        assert (await reply(session))[0] == "HELLO"
        stages = await omni.stages()
        speaker, echo = stages["speaker"], stages["echo"]
        room = mailbox_room(speaker)
        kill_worker(speaker, signal.SIGSTOP)
        try:
            truncating = asyncio.ensure_future(session.truncate(audio_ms=1e4))
            # The session actor's Truncate is out to the frozen speaker (it spent a
            # credit of the speaker's mailbox): it answers nothing else until then.
            await eventually(lambda: mailbox_room(speaker) == room - 1)
            kill_worker(echo)

            async def echo_failed() -> None:
                assert (await omni.health()).stages["echo"].restarts == 1

            await eventually(echo_failed)  # the session actor has been told
            sending = asyncio.ensure_future(session.send(text="x", end="segment"))
            await eventually(lambda: blocked_senders(echo))  # waits for echo's worker
            assert not session.channel.stale  # the session actor has not heard yet
        finally:
            kill_worker(speaker, signal.SIGCONT)
        await truncating
        await sending
        response = session.response
        assert response is not None
        text = ""
        async with asyncio.timeout(60):
            async for event in response.events():
                if isinstance(event, TextDelta):
                    text += event.text
        assert isinstance(response.done, ResponseDone)
        assert (text, response.done.status) == ("X", "completed"), response.done
        assert await history(session) == "u:hello a:HELLO u:x a:X"


async def test_a_session_opened_on_a_restarted_stage_is_not_cut_by_its_late_notice() -> None:
    # The speaker dies while the session's prewarm is out to it: the prewarm goes again
    # to its restarted instance, and the open ends after the orchestrator told the
    # session of the death. The session holds its state on the new speaker: nothing of
    # it was lost, so the notice must not cut it (and cost it a reopen).
    async with OmniPipeline(spec(backoff_s=1.0)) as omni:
        stages = await omni.stages()
        speaker = stages["speaker"]
        room = mailbox_room(speaker)
        kill_worker(speaker, signal.SIGSTOP)
        session = omni.session()
        try:
            opening = asyncio.ensure_future(session.open())
            await eventually(lambda: mailbox_room(speaker) == room - 1)  # its prewarm
        finally:
            kill_worker(speaker)  # SIGKILL: stopped or not, it dies

        async def speaker_failed() -> None:
            assert (await omni.health()).stages["speaker"].restarts == 1

        try:
            await eventually(speaker_failed)  # the session actor has been told
            assert not opening.done()  # while it opened
            assert await opening is None
            assert not session.channel.stale
            await session.send(text="hello")
            assert (await reply(session))[0] == "HELLO"
            assert "~" not in session._key  # never reopened
        finally:
            await session.close()


async def test_a_replay_goes_on_while_stages_keep_dying_under_it(
    tmp_path: pathlib.Path,
) -> None:
    # Four reopens in a row are cut as they end: the speaker took the new key, then died
    # while echo (frozen) held the reopen up. Each time the speaker comes back: the
    # conversation goes on. The speaker's restart is held (its hold file) until echo is
    # frozen, so each reopen's prewarm reaches a frozen echo however slow the machine.
    hold = tmp_path / "speaker-hold"
    async with conversation(spec(backoff_s=1.0, max_restarts=10, speaker_hold=hold)) as (
        omni,
        session,
    ):
        try:
            await session.send(text="hello")
            assert (await reply(session))[0] == "HELLO"
            base = session._key
            stages = await omni.stages()
            echo, speaker = stages["echo"], stages["speaker"]
            hold.touch()
            kill_worker(speaker)

            async def told() -> None:
                assert session.channel.stale

            await eventually(told)
            sending: asyncio.Future[None] | None = None
            for k in range(1, 5):
                room = mailbox_room(echo)
                kill_worker(echo, signal.SIGSTOP)  # before the reopen's prewarm reaches it
                try:
                    hold.unlink()  # the speaker comes back, and the reopen goes on
                    if sending is None:
                        sending = asyncio.ensure_future(session.send(text="x"))

                    async def speaker_took_it(k: int = k) -> None:
                        assert session.channel.terminal is None, session.channel.terminal
                        state = await speaker.ask(Inspect(), timeout=30)
                        assert isinstance(state, StageState)
                        assert f"{base}~{k}" in state.keys

                    # A reopen may wait out an abort to the frozen echo (5 s) and a
                    # restart's backoff (up to 5 s) before the speaker takes the key: slow
                    # on 2 loaded cores, so the wait is generous; what is checked is the
                    # order.
                    await eventually(speaker_took_it, timeout=90)
                    await eventually(lambda room=room: mailbox_room(echo) < room)  # prewarm
                    hold.touch()
                    kill_worker(speaker)

                    async def speaker_failed(k: int = k) -> None:
                        assert (await omni.health()).stages["speaker"].restarts == k + 1

                    await eventually(speaker_failed)  # the session actor has been told
                finally:
                    kill_worker(echo, signal.SIGCONT)
                await eventually(lambda k=k: session._key == f"{base}~{k}")  # then cut
            hold.unlink()
            assert sending is not None
            await sending
            text, _, done = await reply(session)
            assert (text, done.status) == ("X", "completed"), done
            assert await history(session) == "u:hello a:HELLO u:x a:X"
        finally:
            hold.unlink(missing_ok=True)  # a failed test's speaker may still be held


async def test_a_conversation_past_its_history_bound_ends_with_the_stage() -> None:
    async with conversation(spec(history_bytes=8)) as (omni, session):
        await session.send(text="more than eight bytes")
        assert (await reply(session))[2].status == "completed"
        await session.send(text=SECOND)
        response = await session.respond()
        async for event in response.events():
            if isinstance(event, TextDelta) and not session.ended:
                kill_worker((await omni.stages())["echo"])
        error = response.done
        assert isinstance(error, SessionError), error
        assert (error.code, error.stage) == ("stage_failed", "echo")
        assert "max_history_bytes" in error.message
        with pytest.raises(SessionClosedError):
            await session.send(text="again")


async def test_truncating_a_reply_from_before_the_restart_is_refused_clearly() -> None:
    async with conversation(spec()) as (omni, session):
        await restarted(omni, session, "speaker")
        with pytest.raises(InvalidRequestError, match="restarted since the last reply"):
            await session.truncate(audio_ms=100)
        await session.send(text="x")  # reopens once the speaker is back
        assert (await reply(session))[0] == "X"


async def test_a_truncate_racing_a_stage_death_is_refused_not_fatal() -> None:
    async with conversation(spec()) as (omni, session):
        await session.send(text="hello")
        assert (await reply(session))[0] == "HELLO"
        kill_worker((await omni.stages())["speaker"])
        with pytest.raises(InvalidRequestError):  # whichever it heard of first
            await session.truncate(audio_ms=100)
        await session.send(text="x")
        text, _, done = await reply(session)
        if done.status == "failed":  # sent before the session heard of the death
            assert done.code == "stage_failed", done
            text, _, done = await reply(session)
        assert (text, done.status) == ("X", "completed"), done


async def test_a_chunk_gap_costs_the_response_not_the_conversation() -> None:
    # The speaker's input stream loses its seq 4: turn 1 is seqs 0-2 ("H", "I", the
    # end), turn 2's "B" is seq 4.
    faults = PipelineFaults(edges={"echo->speaker": ChunkFaults(drop=frozenset({4}))})
    async with (
        OmniPipeline(spec(process=False), **faults.hooks()) as omni,
        omni.session() as session,
    ):
        await session.send(text="hi")
        assert (await reply(session))[0] == "HI"
        await session.send(text="abcdef")
        _, _, failed = await reply(session)
        assert (failed.status, failed.code, failed.stage) == ("failed", "chunk_gap", "speaker")
        assert not session.ended
        # The reopened streams count from 0 again: 3 characters and the end stay clear
        # of seq 4.
        text, samples, done = await reply(session, max_tokens=3)
        assert (text, samples, done.status) == ("ABC", 3 * SAMPLES_PER_CHAR, "completed")
        echo = actor_instance((await omni.stages())["echo"])
        assert isinstance(echo, StageActor)
        assert isinstance(echo.engine, ReplayEcho)
        held = echo.engine.sessions[session._key].history
        assert held == ["u:hi", "a:HI", "u:abcdef", "a:ABC"]
        assert echo.engine.replayed[session._key] == 1  # "HI" came back as a reply mark


async def test_a_deleted_turn_or_reply_leaves_every_stage() -> None:
    async with conversation(spec(process=False)) as (_, session):
        assert session.deletes_turns
        await session.send(text="one")
        await session.commit(turn="t1")
        _, _, first = await reply(session)
        await session.send(text="two")
        await session.commit(turn="t2")
        response = await session.respond()
        with pytest.raises(InvalidRequestError, match="in flight"):
            await session.delete("t1")
        async for _ in response.events():
            pass
        assert await session.delete("t1")
        assert await session.delete(first.response)
        assert not await session.delete("nobody")
        # The stages replayed the conversation without them: no audio is left to cut.
        with pytest.raises(InvalidRequestError, match="deleted"):
            await session.truncate(0)
        assert await history(session) == "u:two a:TWO"
        await session.send(text="three")
        text, samples, _ = await reply(session)  # the speaker goes on as before
        assert (text, samples) == ("THREE", len(text) * SAMPLES_PER_CHAR)


async def test_an_engine_that_cannot_replay_cannot_have_turns_deleted() -> None:
    async with conversation(spec(kind="TurnEcho", process=False)) as (_, session):
        assert not session.deletes_turns
        await session.send(text="one")
        await session.commit(turn="t1")
        with pytest.raises(InvalidRequestError, match="cannot be deleted"):
            await session.delete("t1")
