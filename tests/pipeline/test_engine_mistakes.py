"""Mistakes in a user's own engine surface early, with errors that say what to fix.

An output field the engine does not declare, an output that is not a mapping of fields,
or a value a stage cannot send (not a tensor or a str; audio that is not 1-D float32
samples) fails that reply (``engine_error``) at the first such output, naming the engine
and what to yield instead; the session goes on. A class without a method of the engine
protocol fails the pipeline's start, naming the method. An engine class defined in the
script being run (``__main__``) is refused for a worker process when the pipeline
loads: a worker cannot import it.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from pipeline_helpers import collect, text_of
from pydantic import ValidationError

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.registry import EngineUnavailableError
from omni_actors.actors.stage.actor import StageActor
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.events import ResponseDone, SessionError, TextDelta
from omni_actors.testing.inspection import actor_instance


class _Engine:
    """What every engine here shares: text in, text out, no state."""

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...


class Undeclared(_Engine):
    """Replies ``ok``; input ``extra`` makes it also yield ``spoken``, undeclared. It
    keeps how each reply ended for it."""

    def __init__(self, args: object) -> None:
        self.ended: list[str] = []

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Any]:
        said = "".join([str(fields["text"]) async for fields in inputs])
        try:
            yield {"text": "ok "}
            if said == "extra":
                yield {"text": "and ", "spoken": "!"}
                yield {"text": "more"}
        except BaseException as exc:
            self.ended.append(type(exc).__name__)
            raise
        self.ended.append("done")


class Stringly(_Engine):
    """Yields its reply as a bare string; input ``fine`` makes it yield a dict."""

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Any]:
        said = "".join([str(fields["text"]) async for fields in inputs])
        yield {"text": "ok "} if said == "fine" else "ok "


def spec(kind: str, *, process: bool = False) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "mistakes",
            "stages": [{"name": "entry", "process": process, "engine": {"kind": kind}}],
            "outputs": {"text": "entry"},
            "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
        }
    )


async def reply(omni: OmniPipeline, session: Any, text: str) -> tuple[str, ResponseDone]:
    await session.send(text=text)
    response = await session.respond()
    events = [event async for event in response.events()]
    done = events[-1]
    assert isinstance(done, ResponseDone), events
    return "".join(e.text for e in events if isinstance(e, TextDelta)), done


async def test_an_undeclared_output_field_fails_the_reply_and_names_the_declaration() -> None:
    async with OmniPipeline(spec("test_engine_mistakes:Undeclared")) as omni:
        entry = actor_instance((await omni.stages())["entry"])
        assert isinstance(entry, StageActor)
        engine = entry.engine
        assert isinstance(engine, Undeclared)
        async with omni.session() as session:
            text, done = await reply(omni, session, "extra")
            assert done.status == "failed"
            assert (done.code, done.stage) == ("engine_error", "entry")
            assert "'spoken'" in done.message
            assert "Undeclared" in done.message
            assert "declares outputs ['text']" in done.message
            assert "declare it in outputs" in done.message
            assert "or stop yielding it" in done.message
            # It failed at the first such output: nothing of it or after it went out,
            # and the engine saw the failure there (to roll the reply back), not a cancel.
            assert text == "ok "
            assert engine.ended == ["EngineOutputError"]
            # The session goes on.
            text, done = await reply(omni, session, "plain")
            assert (text, done.status) == ("ok ", "completed")
        # A one-shot request fails as a whole.
        events = await collect(omni.generate(text="extra", modalities=("text",)))
    error = events[-1]
    assert isinstance(error, SessionError), events
    assert error.code == "engine_error"
    assert "'spoken'" in error.message
    assert "EngineOutputError" in error.error_type


async def test_an_output_that_is_not_a_mapping_fails_the_reply_and_says_what_to_yield() -> None:
    kind = "test_engine_mistakes:Stringly"
    async with OmniPipeline(spec(kind)) as omni, omni.session() as session:
        text, done = await reply(omni, session, "a string")
        assert done.status == "failed"
        assert (done.code, done.stage) == ("engine_error", "entry")
        assert "Stringly yielded a str" in done.message
        assert "generate() must yield dicts of declared fields" in done.message
        assert "{'text': ...}" in done.message
        assert "has no attribute" not in done.message
        assert text == ""
        text, done = await reply(omni, session, "fine")
        assert (text, done.status) == ("ok ", "completed")


class Valued(_Engine):
    """Replies with one output whose value its input names (``ok``: a fine one)."""

    outputs: ClassVar[dict[str, str]] = {"text": "concat", "codes": "concat", "audio": "concat"}

    VALUES: ClassVar[dict[str, Any]] = {
        "numpy": {"audio": np.zeros(240, dtype=np.float32)},
        "list": {"codes": [1, 2, 3]},
        "int": {"codes": 3},
        "stereo": {"audio": torch.zeros(2, 240)},
        "float64": {"audio": torch.zeros(240, dtype=torch.float64)},
        "ok": {
            "text": "ok ",
            "codes": torch.zeros(3, dtype=torch.int64),
            "audio": torch.zeros(240),
        },
    }

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Any]:
        said = "".join([str(fields["text"]) async for fields in inputs])
        yield self.VALUES[said]


VALUED = PipelineSpec.model_validate(
    {
        "name": "values",
        "stages": [{"name": "entry", "engine": {"kind": "test_engine_mistakes:Valued"}}],
        "outputs": {"text": "entry", "audio": "entry"},
        "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
    }
)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("numpy", ["field 'audio'", "a numpy.ndarray", "torch.from_numpy("]),
        ("list", ["field 'codes'", "a list", "torch.tensor("]),
        ("int", ["field 'codes'", "an int", "torch.tensor("]),
        ("stereo", ["field 'audio'", "2-D", "(2, 240)", "1-D", "one channel"]),
        ("float64", ["field 'audio'", "torch.float64", "float32", ".to(torch.float32)"]),
    ],
)
async def test_an_output_value_a_stage_cannot_send_fails_the_reply_and_says_what_to_yield(
    value: str, says: list[str]
) -> None:
    async with OmniPipeline(VALUED) as omni, omni.session() as session:
        _, done = await reply(omni, session, value)
        assert (done.status, done.code, done.stage) == ("failed", "engine_error", "entry"), done
        assert "test_engine_mistakes:Valued yielded" in done.message
        for words in says:
            assert words in done.message
        assert "has no attribute" not in done.message
        # The session goes on.
        text, done = await reply(omni, session, "ok")
        assert (text, done.status) == ("ok ", "completed")


class NoRelease:
    """An engine that forgot ``release``: every session would fail to end on it."""

    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Any]:
        async for fields in inputs:
            yield fields


@pytest.mark.parametrize("process", [False, True])
async def test_an_engine_without_a_method_of_the_protocol_fails_the_pipelines_start(
    process: bool,
) -> None:
    with pytest.raises(EngineUnavailableError) as info:
        async with OmniPipeline(spec("test_engine_mistakes:NoRelease", process=process)):
            pass
    message = str(info.value)
    assert "test_engine_mistakes:NoRelease" in message
    assert "it has no release() method" in message
    assert "async def release(self, session: str) -> None" in message


class Scripted(_Engine):
    """An engine written in the script being run (its module is ``__main__``)."""

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Any]:
        async for fields in inputs:
            yield fields


@pytest.fixture
def in_main(monkeypatch: pytest.MonkeyPatch) -> str:
    """The kind of ``Scripted`` as the script that defines it would name it."""
    monkeypatch.setattr(Scripted, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "Scripted", Scripted, raising=False)
    return "__main__:Scripted"


def test_an_engine_defined_in_main_is_refused_for_a_worker_process(in_main: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(in_main, process=True)
    message = str(info.value)
    assert "stages[entry].engine.kind" in message
    assert "defined in __main__" in message
    assert "a worker process cannot import it" in message
    assert "move it into a module" in message
    assert "process: false" in message


async def test_an_engine_defined_in_main_runs_in_the_pipelines_process(in_main: str) -> None:
    async with OmniPipeline(spec(in_main)) as omni:
        events = await collect(omni.generate(text="hi", modalities=("text",)))
    assert text_of(events) == "hi"
