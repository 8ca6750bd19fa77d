"""A user's own engine — a class outside this package — runs in a pipeline.

The engine lives in a throwaway module written into the test's tmp dir and is named by
its import path, as a voice-agent developer names theirs: in the pipeline's process,
and in a worker process (``process: true``), which imports it from the parent's path.
Its arguments refuse a key they do not declare, as a built-in engine's do.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline_helpers import collect, done, text_of
from pydantic import ValidationError

from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec

SHOUT = '''
"""A user's stage: shouts whatever text the stage before it says."""

from collections.abc import AsyncIterator

from pydantic import BaseModel


class ShoutArgs(BaseModel):
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


def spec(module: str, *, process: bool, args: dict[str, str] | None = None) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "shouting",
            "stages": [
                {"name": "thinker", "engine": {"kind": "scripted", "args": {"outputs": 3}}},
                {
                    "name": "shout",
                    "process": process,
                    "engine": {"kind": f"{module}:Shout", "args": args or {"suffix": "!!"}},
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


def test_a_typo_in_a_users_engine_args_is_refused_when_the_pipeline_loads(
    user_module: str,
) -> None:
    # ``ShoutArgs`` says nothing of extra keys, as the model in docs/engines.md does.
    with pytest.raises(ValidationError) as info:
        spec(user_module, process=False, args={"sufix": "!!"})
    message = str(info.value)
    assert "stages[shout].engine.args.sufix: Extra inputs are not permitted" in message
    assert "takes suffix" in message
