"""Driving tiny-omni's thinker engine directly, for the tests that hold a conversation
with it: a started engine, the tiny-omni weights it loads, and turn marks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from tiny_omni_ids import PRINTABLE_RANGES

from omni_actors.actors.engines.qwen3_omni import weights
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.models import cache as model_cache


class _Engine(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


E = TypeVar("E", bound=_Engine)


def prepared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh model cache holding the tiny-omni weights."""
    cache = tmp_path_factory.mktemp("model-cache")
    model_cache.prepare("tiny-omni", cache_dir=cache)
    return cache


def thinker_model(cache_dir: Path) -> Any:
    """The thinker's HF model, for a reference decode."""
    return weights.load(cache_dir / "tiny-omni" / "seed-0", "thinker")


@asynccontextmanager
async def started(engine: E) -> AsyncIterator[E]:
    """``engine`` started for the block, stopped after it."""
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


def thinker(cache_dir: Path, **extra: Any) -> AbstractAsyncContextManager[ThinkerEngine]:
    """A started engine (greedy, 6 printable tokens a reply unless ``extra`` says
    otherwise)."""
    args = {
        "seed": 0,
        "cache_dir": str(cache_dir),
        "min_new_tokens": 6,
        "max_new_tokens": 6,
        "allowed_token_ranges": PRINTABLE_RANGES,
    }
    return started(ThinkerEngine(ThinkerArgs(**{**args, **extra})))
