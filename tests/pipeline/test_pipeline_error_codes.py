"""A stage's failure reaches the caller with the code its error class carries."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pipeline_helpers import make_spec

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.stage.actor import StageActor
from omni_actors.errors import EngineError, OmniError
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.protocols.events import SessionError
from omni_actors.protocols.stage import SessionKey


class UpstreamTimeoutError(OmniError):
    """A user's engine calls a service that did not answer in time: its own code."""

    code = "timeout"


class BadAudioError(EngineError):
    """A user's engine error that keeps the code of every engine error."""


class WithoutCodeError(OmniError):
    """An ``OmniError`` that declares no code of its own."""


class FailingEngine:
    """An engine (a user's own class) whose every session fails on its first input."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def start(self) -> None:
        pass

    def generate(self, session: SessionKey, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        return self._fail(inputs)

    async def _fail(self, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        await anext(inputs)
        raise self.error
        yield {}  # an async generator

    async def abort(self, session: SessionKey) -> None:
        pass

    async def release(self, session: SessionKey) -> None:
        pass

    async def stop(self) -> None:
        pass


def failing_stage(error: Exception) -> type[StageActor]:
    class FailingStage(StageActor):
        async def on_start(self) -> None:
            self.engine = FailingEngine(error)

    return FailingStage


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UpstreamTimeoutError("the speaker service did not answer"), "timeout"),
        (BadAudioError("unreadable audio"), "engine_error"),
        (WithoutCodeError("something else"), "internal"),
        (RuntimeError("CUDA error: out of memory"), "engine_error"),  # not ours: the engine's
    ],
    ids=["own-code", "engine-error", "omni-default", "foreign"],
)
async def test_the_error_class_code_reaches_the_caller(error: Exception, code: str) -> None:
    stages = {"talker": failing_stage(error)}
    async with OmniPipeline(make_spec(), stage_classes=stages) as omni:
        events = [event async for event in omni.generate(text="hi")]
    failed = events[-1]
    assert isinstance(failed, SessionError), events
    assert (failed.code, failed.stage) == (code, "talker")
    assert failed.error_type == f"{type(error).__module__}:{type(error).__qualname__}"
    assert str(error) in failed.message
