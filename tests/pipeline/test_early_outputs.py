"""What an entry engine yields while the user turn still arrives is the next reply's.

``Echo`` is the engine ``docs/engines.md`` shows a user how to write: it streams its
input and yields as each chunk arrives. As the only stage of a conversation it answers
the turn before the caller asks for a reply: those outputs wait for the response that
answers the turn (``respond``, or the session's end), and reach the caller as that
response's deltas, under its id, then its ``ResponseDone``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.events import Done, Event, ResponseDone, TextDelta
from omni_actors.testing import eventually
from omni_actors.testing.inspection import actor_instance

DEADLINE_S = 10.0  # a response that never ends fails the test instead of hanging it


class Echo:
    """Upper-cases each text chunk as it arrives (``docs/engines.md``'s engine); counts
    the outputs the stage has routed (it asked for the next one)."""

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}
    streams_input = True

    def __init__(self, args: object) -> None:
        self.routed = 0

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        async for chunk in inputs:
            yield {"text": str(chunk["text"]).upper()}
            self.routed += 1


SPEC = PipelineSpec.model_validate(
    {
        "name": "echo",
        "stages": [{"name": "entry", "engine": {"kind": "test_early_outputs:Echo"}}],
        "outputs": {"text": "entry"},
        "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
    }
)


@asynccontextmanager
async def echo_session() -> AsyncIterator[tuple[Session, Echo]]:
    async with OmniPipeline(SPEC) as omni, omni.session() as session:
        entry = actor_instance((await omni.stages())["entry"])
        assert isinstance(entry, StageActor)
        assert isinstance(entry.engine, Echo)
        yield session, entry.engine


async def said_before_asked(session: Session, engine: Echo, text: str) -> None:
    """Send ``text`` and wait until the engine's answer to it has left the stage (in this
    process, the session's actor has taken it by then)."""
    before = engine.routed
    await session.send(text=text)
    await eventually(lambda: engine.routed > before, what="the echo routed")


async def test_outputs_before_respond_are_the_responses_deltas() -> None:
    async with echo_session() as (session, engine):
        for turn in ("hi", "again"):
            await said_before_asked(session, engine, turn)
            response = await session.respond()
            async with asyncio.timeout(DEADLINE_S):
                events: list[Event] = [e async for e in response.events()]
            done = events[-1]
            assert isinstance(done, ResponseDone), events
            assert (done.response, done.status) == (response.id, "completed")
            deltas = [e for e in events if isinstance(e, TextDelta)]
            assert [(d.text, d.response) for d in deltas] == [(turn.upper(), response.id)]
            # The text came before the response was asked for: the caller had it at once.
            assert done.metrics.ttft_ms == 0.0


async def test_a_turn_answered_early_and_then_cancelled_takes_the_next_response() -> None:
    async with echo_session() as (session, engine):
        await said_before_asked(session, engine, "hi")
        response = await session.respond()
        async with asyncio.timeout(DEADLINE_S):
            await response.cancel()
            done = await response.wait()
        assert isinstance(done, ResponseDone)
        assert done.response == response.id
        await said_before_asked(session, engine, "next")
        async with asyncio.timeout(DEADLINE_S):
            done = await (await session.respond()).wait()
        assert isinstance(done, ResponseDone)
        assert done.status == "completed"


async def test_outputs_before_the_end_of_a_conversation_are_its_last_reply() -> None:
    async with echo_session() as (session, engine):
        await said_before_asked(session, engine, "bye")
        await session.finish()
        async with asyncio.timeout(DEADLINE_S):
            events: list[Any] = [e async for e in session]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["BYE"]
    assert isinstance(events[-1], Done), events
