"""A local two-node Ray cluster for the scale-out tests (skipped without the ray extra).

Node A (the head) offers the custom resource ``node_a``, node B offers ``node_b``: a
stage that asks for one of them is pinned to that node. The test process is connected
to the cluster as its driver, so a pipeline started here uses that connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from omni_actors.model_cache import prepare

ray = pytest.importorskip("ray", reason="the ray extra is not installed")


@dataclass
class LocalCluster:
    """The cluster, its address and the Ray node id of each of its two nodes."""

    cluster: Any
    address: str
    node_a: str
    node_b: str


@pytest.fixture(scope="package")
def local_ray() -> Iterator[LocalCluster]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"node_a": 2}, "include_dashboard": False},
    )
    node_b = cluster.add_node(num_cpus=2, resources={"node_b": 4})
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        yield LocalCluster(cluster, cluster.address, cluster.head_node.node_id, node_b.node_id)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="package")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-omni", cache_dir=root)
    return root
