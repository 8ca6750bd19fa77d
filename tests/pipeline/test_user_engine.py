"""A user's own engine — a class outside this package — runs in a pipeline.

The engine lives in a throwaway module written into the test's tmp dir and is named by
its import path, as a voice-agent developer names theirs: in the pipeline's process,
and in a worker process (``process: true``), which imports it from the parent's path.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline_helpers import collect, done, text_of

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec

SHOUT = '''
"""A user's stage: shouts whatever text the stage before it says."""

from collections.abc import AsyncIterator

from pydantic import BaseModel


class ShoutArgs(BaseModel):
    model_config = {"extra": "forbid"}
    suffix: str = "!"


class Shout:
    Args = ShoutArgs
    inputs = {"text": "concat"}
    outputs = {"text": "concat"}

    def __init__(self, args: ShoutArgs) -> None:
        self.suffix = args.suffix

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator) -> AsyncIterator:
        async for chunk in inputs:
            yield {"text": chunk["text"].upper()}
        yield {"text": self.suffix}
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a module holding ``Shout``, importable from ``tmp_path`` only."""
    name = f"my_stages_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(SHOUT)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def spec(module: str, *, process: bool) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "shouting",
            "stages": [
                {"name": "thinker", "engine": {"kind": "scripted", "args": {"outputs": 3}}},
                {
                    "name": "shout",
                    "process": process,
                    "engine": {"kind": f"{module}:Shout", "args": {"suffix": "!!"}},
                },
            ],
            "edges": [{"from": "thinker", "to": "shout"}],
            "outputs": {"text": "shout"},
        }
    )


@pytest.mark.parametrize("process", [False, True], ids=["in-process", "worker-process"])
async def test_a_users_engine_runs_in_a_pipeline(user_module: str, process: bool) -> None:
    shouting = spec(user_module, process=process)
    assert shouting.edge_fields("thinker", "shout") == ("text",)  # what both ends declare
    async with OmniPipeline(shouting) as omni:
        events = await collect(omni.generate(text="hi", modalities=("text",)))
    done(events)
    assert text_of(events) == "T0 T1 T2 !!"
