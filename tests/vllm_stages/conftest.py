"""The vLLM tests: they need the vllm extra (the dev install has it) and start vLLM,
tens of seconds each time, so every module shares what it starts."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.models.cache import prepare


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = importlib.util.find_spec("vllm") is None
    for item in items:
        if "tests/vllm_stages/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.vllm)
            if missing:
                item.add_marker(pytest.mark.skip(reason="needs the vllm extra"))


@pytest.fixture(scope="package")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("model-cache")
    prepare("tiny-omni", cache_dir=cache)
    return cache


CPU_ENGINE_ARGS = {
    "enforce_eager": True,
    "limit_mm_per_prompt": {"image": 0, "video": 0},
    "kv_cache_memory_bytes": 128 << 20,
    "gpu_memory_utilization": 0.05,
}
"""vLLM on a CPU: a small fixed KV cache in host memory, no vision inputs."""


@asynccontextmanager
async def thinkers(
    cache_dir: Path, limits: Mapping[str, int], engine_args: Mapping[str, Any] = CPU_ENGINE_ARGS
) -> AsyncIterator[tuple[Any, ThinkerEngine]]:
    """tiny-omni's thinker on vLLM (greedy, float32, on the CPU, with ``engine_args``)
    and on torch, both started with the same token ``limits``: the vLLM one is measured
    against the other."""
    from omni_actors.actors.engines.vllm.thinker import VllmThinkerArgs, VllmThinkerEngine

    vllm = VllmThinkerEngine(
        VllmThinkerArgs(
            model="tiny-omni",
            cache_dir=cache_dir,
            dtype="float32",
            max_model_len=1024,
            max_num_seqs=4,
            allowed_token_ranges=[(32, 127)],
            engine_args=dict(engine_args),
            **limits,
        )
    )
    torch_thinker = ThinkerEngine(
        ThinkerArgs(cache_dir=cache_dir, allowed_token_ranges=[(32, 127)], **limits)
    )
    await vllm.start()
    await torch_thinker.start()
    try:
        yield vllm, torch_thinker
    finally:
        await torch_thinker.stop()
        await vllm.stop()
