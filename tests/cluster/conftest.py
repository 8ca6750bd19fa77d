"""A local two-node Ray cluster for the scale-out tests (skipped without the ray extra).

Node A (the head) offers the custom resource ``node_a``, node B offers ``node_b``: a
stage that asks for one of them is pinned to that node (``local_ray.pin``). The test
process is the cluster's driver, so a pipeline started here uses that connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from omni_actors.models.cache import prepare

pytest.importorskip("ray", reason="the ray extra is not installed")

from omni_actors.cluster.local_ray import LocalRay, start_local_ray


@pytest.fixture(scope="module")
def local_ray() -> Iterator[LocalRay]:
    cluster = start_local_ray()
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-omni", cache_dir=root)
    return root
