"""An engine can tell whether its next input is already there (``input_at_hand``): a
stage's input iterator says so once the chunk has come, and at the input's end."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from omni_actors.actors.engines.contract import Fields, input_at_hand
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.events import ResponseDone
from omni_actors.testing import eventually

SEEN: list[tuple[str, bool]] = []


class Peeks:
    """Says its input back; notes, before each read, whether the read would wait."""

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        said = ""
        SEEN.append(("before any read", input_at_hand(inputs)))
        first = await anext(inputs)
        said += str(first["text"])
        # The caller sent the rest with the first: it comes to the stage's queue.
        await eventually(lambda: input_at_hand(inputs), what="the second chunk at hand")
        async for fields in inputs:
            said += str(fields["text"])
        SEEN.append(("after the end", input_at_hand(inputs)))
        yield {"text": said}


async def _feed() -> AsyncIterator[Fields]:
    yield {"text": "x"}


async def test_a_stage_input_says_when_its_next_chunk_is_at_hand() -> None:
    SEEN.clear()
    spec = PipelineSpec.model_validate(
        {
            "name": "peeks",
            "stages": [{"name": "entry", "engine": {"kind": "test_input_at_hand:Peeks"}}],
            "edges": [],
            "outputs": {"text": "entry"},
        }
    )
    async with OmniPipeline(spec) as omni, omni.session() as session:
        await session.send(text="a")
        await session.send(text="b")
        reply = await session.respond()
        done = await reply.wait()
        assert isinstance(done, ResponseDone), done
    assert SEEN == [("before any read", True), ("after the end", True)]
    # An iterator that cannot say never is at hand.
    assert not input_at_hand(_feed())
