"""``SessionActor`` routes a stage's failure by where it came from (``StageReport.failure``).

A stream that broke (a peer gone, lost chunks) costs a conversation the response in
flight, not the conversation; the engine's failure of the session ends it. The stage on
the path is a real one (scripted), the session actor is driven through its messages.
"""

from __future__ import annotations

import pytest

from omni_actors._ref import ActorRef
from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.conversation_log import ConversationLog
from omni_actors.pipeline.session_actor import SessionActor, SessionChannel, StagePlan
from omni_actors.protocols.control import (
    Deadlines,
    Inspect,
    OpenSession,
    SessionMessage,
    StageMessage,
)
from omni_actors.protocols.events import ResponseDone, SessionError
from omni_actors.protocols.stage import (
    INPUT,
    FailureCause,
    SessionKey,
    StageMetrics,
    StageReport,
)
from omni_actors.testing import ActorTestKit

DEADLINES = Deadlines(first_chunk_s=5, inter_chunk_s=5, idle_s=5, total_s=10)
KEY = SessionKey("s#1")
# How a peer's death may reach the stage: as an error rebuilt from another process, whose
# class name says nothing of a peer. The stage knows it sent to a peer; its report says so.
REMOTE = "omni_actors.transport.remote:RemoteError"


async def conversation(
    kit: ActorTestKit,
) -> tuple[ActorRef[SessionMessage], SessionChannel, ActorRef[StageMessage]]:
    """A conversation's actor on one scripted stage, prewarmed, its first response in
    flight (the caller has ended its input's segment 0)."""
    stage = await kit.spawn(StageActor, "thinker", "scripted", {"fields": ["text"]})
    plan = {"thinker": StagePlan(ref=stage, sources=(INPUT,), targets=(), emit=("text",))}
    channel = SessionChannel(sample_rate=24_000)
    channel.history = ConversationLog(1 << 20)
    actor = await kit.spawn(
        SessionActor, "s", KEY, plan, DEADLINES, True, kit.system.clock.now() + 5, channel
    )
    assert await actor.ask(OpenSession()) is None
    assert (await stage.ask(Inspect())).keys == [KEY]
    channel.segments_sent = 1  # as ``Session`` does once the caller ends the segment
    return actor, channel, stage


def error(failure: FailureCause, code: str = "internal") -> StageReport:
    return StageReport(
        key=KEY,
        stage="thinker",
        segment=0,
        end="error",
        metrics=StageMetrics(),
        code=code,  # type: ignore[arg-type]
        error_type=REMOTE,
        error="the talker is gone",
        failure=failure,
    )


@pytest.mark.parametrize(
    ("failure", "code"), [("peer_gone", "internal"), ("chunk_gap", "chunk_gap")]
)
async def test_a_broken_stream_fails_the_response_and_keeps_the_conversation(
    failure: FailureCause, code: str
) -> None:
    async with ActorTestKit() as kit:
        actor, channel, stage = await conversation(kit)
        await actor.tell(error(failure, code))
        done = await channel.get()
        assert isinstance(done, ResponseDone), done
        assert (done.status, done.code, done.stage) == ("failed", code, "thinker")
        assert channel.stale == "the talker is gone"  # the next input reopens the stages
        assert channel.terminal is None
        assert actor.is_alive

        # The stream's other ends are freed: they are reopened under a new key.
        async def freed() -> bool:
            return (await stage.ask(Inspect())).keys == []

        await kit.eventually(freed, what="the stage freed the session")


async def test_the_engines_failure_ends_the_session() -> None:
    async with ActorTestKit() as kit:
        actor, channel, stage = await conversation(kit)
        await actor.tell(error("engine", code="engine_error"))
        ended = await channel.get()
        assert isinstance(ended, SessionError), ended
        assert (ended.code, ended.stage, ended.error_type) == ("engine_error", "thinker", REMOTE)
        assert channel.terminal is ended
        assert not channel.stale
        assert await kit.terminated(actor) is None
        assert (await stage.ask(Inspect())).keys == []
