"""Fixtures of the tests that drive tiny-omni's thinker engine directly (a module may
define its own ``cache_dir`` or ``model`` instead)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh model cache holding the tiny-omni weights."""
    from thinker_driving import prepared_cache  # imports torch models: only when used

    return prepared_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def model(cache_dir: Path) -> Any:
    """The thinker's HF model, for a reference decode."""
    from thinker_driving import thinker_model

    return thinker_model(cache_dir)


@pytest.fixture
def fresh_compiles() -> Iterator[None]:
    """Compiled code and the sizes torch.compile saw made dynamic are process-wide: each
    test compiles from scratch, and leaves nothing for the next."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
