"""Devices under Ray: a worker computes on the GPU Ray assigned to its bundle.

Ray's GPUs here are logical (this machine has none): what is checked is that Ray's
assignment reaches the worker the way a stage's ``device: cuda`` reads it, through
``CUDA_VISIBLE_DEVICES``. (Here rather than in ``tests/cluster``: the workers import
the test actors of this directory.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_actors import Environ, EnvVar

from omni_actors import ActorSystem, Props
from omni_actors.cluster.ray_hosts import RayBundle, RayCluster, import_ray

pytest.importorskip("ray", reason="the ray extra is not installed")

pytestmark = [pytest.mark.ray, pytest.mark.integration]

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def gpu_node(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Any]:
    ray = import_ray()
    from ray.cluster_utils import Cluster

    # The nodes' workers (and so our workers) import the test actors from here.
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch_module.setenv("PYTHONPATH", path)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=2, num_gpus=2)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


async def test_a_worker_sees_the_gpu_ray_gave_its_bundle(gpu_node: Any) -> None:
    cluster = RayCluster(
        gpu_node.address,
        [RayBundle(num_cpus=1, num_gpus=1), RayBundle(num_cpus=1, num_gpus=1)],
        log_to_driver=False,
    )
    await cluster.start(60)
    try:
        async with ActorSystem() as system:
            seen = set()
            for index in range(2):
                props = Props(process=True, host=cluster.host(index), start_timeout=60)
                ref = await system.spawn(Environ, name=f"gpu-{index}", props=props)
                seen.add(await ref.ask(EnvVar("CUDA_VISIBLE_DEVICES"), timeout=10))
            assert seen == {"0", "1"}  # one GPU each, not the same one
    finally:
        await cluster.close()
