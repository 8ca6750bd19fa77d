"""Tests that need a CUDA device; skipped where there is none (CI).

On a machine with a GPU and without the project's dependencies (no package registry),
carry their wheels and run, from the repository root::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 -m pip install -q --no-deps --no-build-isolation -e .
    PYTHONPATH=/tmp/site python3 -m pytest -q -p no:cacheprovider tests/gpu tests/cuda

(``.whl`` holds msgspec, pyzmq, pydantic and pydantic-core, annotated-types,
typing-inspection, websockets, starlette, uvicorn, httptools, anyio, h11, click,
pytest, pytest-asyncio, pluggy and iniconfig, built for that machine's Python: on a
machine with a registry, ``pip download --no-deps --only-binary=:all: --python-version
3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any
-d .whl NAME==VERSION`` for each, at the versions ``pip list`` shows in the dev venv.)
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    for item in items:
        if "tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
