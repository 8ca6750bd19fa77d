"""A pipeline admits no more sessions at once than its stages hold: an engine with a KV
slot per session tells ``max_sessions``, and the session past it waits at admission
instead of failing inside the stage; the server refuses it as busy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import ClassVar

from omni_actors.actors.engines.contract import Fields
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.protocols.events import Done, TextDelta
from omni_actors.server.settings import ServerSettings
from omni_actors.server.state import ServerState
from omni_actors.testing import engine_pipeline
from omni_actors.testing.waiting import consistently, eventually


class TwoSlots:
    """Holds two sessions at once; each reply waits for ``gate``."""

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}
    max_sessions = 2
    gate: ClassVar[asyncio.Event]
    inside: ClassVar[int] = 0
    peak: ClassVar[int] = 0

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        said = "".join([str(fields["text"]) async for fields in inputs])
        cls = type(self)
        cls.inside += 1
        cls.peak = max(cls.peak, cls.inside)
        try:
            await cls.gate.wait()
            yield {"text": said.upper()}
        finally:
            cls.inside -= 1


async def _reply(omni: OmniPipeline, text: str) -> str:
    events = [event async for event in omni.generate(text=text)]
    assert isinstance(events[-1], Done), events
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_a_session_past_what_a_stage_holds_waits_for_a_slot() -> None:
    TwoSlots.gate, TwoSlots.inside, TwoSlots.peak = asyncio.Event(), 0, 0
    async with OmniPipeline(engine_pipeline(TwoSlots), max_sessions=8) as omni:
        assert omni.max_sessions == 2
        replies = [asyncio.ensure_future(_reply(omni, word)) for word in ("a", "b", "c")]
        await eventually(lambda: TwoSlots.inside == 2, what="two sessions in the engine")
        await consistently(lambda: TwoSlots.inside == 2, what="the third waits")
        TwoSlots.gate.set()
        assert await asyncio.gather(*replies) == ["A", "B", "C"]
    assert TwoSlots.peak == 2


async def test_the_server_takes_the_stages_limit() -> None:
    TwoSlots.gate = asyncio.Event()
    async with OmniPipeline(engine_pipeline(TwoSlots), max_sessions=8) as omni:
        state = ServerState(ServerSettings(max_sessions=5), omni)
        assert state.max_sessions == 2
        assert [state.admit() for _ in range(3)] == [True, True, False]


async def test_stages_without_a_limit_leave_max_sessions_as_asked() -> None:
    async with OmniPipeline("scripted-omni", max_sessions=3) as omni:
        assert omni.max_sessions == 3
