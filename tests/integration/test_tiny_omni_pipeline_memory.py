"""A closed pipeline's models are freed when ``close`` returns, not whenever the garbage
collector next runs: a model loaded next in the process (another pipeline, the next
level of a benchmark) must find the device's memory given back."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omni_actors.actors.engines.qwen3_omni.thinker_model import ThinkerModel
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import load_pipeline

pytestmark = pytest.mark.asyncio


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    """The collector runs only when called: a collection by chance would hide a model
    left to it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


async def test_a_closed_pipeline_s_models_are_freed_when_close_returns(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch, no_automatic_collection: None
) -> None:
    loaded: list[weakref.ref[ThinkerModel]] = []
    init = ThinkerModel.__init__

    def tracked(self: ThinkerModel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        loaded.append(weakref.ref(self))

    monkeypatch.setattr(ThinkerModel, "__init__", tracked)
    spec = load_pipeline("tiny-omni").without_transcriber().with_weights(cache_dir=cache_dir)
    async with OmniPipeline(spec) as omni:
        events = [event async for event in omni.generate("hi", modalities=("text",))]
    assert type(events[-1]).__name__ == "Done"
    assert len(loaded) == 1
    assert loaded[0]() is None, "the thinker's model outlived its closed pipeline"
