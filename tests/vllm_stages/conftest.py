"""The vLLM tests: they need the vllm extra (the dev install has it) and start vLLM,
tens of seconds each time, so every module shares what it starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from omni_actors.model_cache import prepare


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
