"""A two-node Ray cluster on this machine, to try scale-out without a second machine.

Node A (the head) offers the custom resource ``node_a``, node B offers ``node_b``: a
stage whose placement asks for one of them runs on that node
(``omni_actors.pipeline.cluster_hosts.pin``). Both nodes
are Ray processes on this host, so the stages still talk over TCP with CURVE, as across
machines, only over loopback. ``bench pipeline --cluster local-ray`` and the scale-out
tests use it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from omni_actors.cluster.ray_hosts import import_ray

__all__ = ["LOCAL_RAY", "LocalRay", "start_local_ray"]

LOCAL_RAY = "local-ray"
"""The ``--cluster`` value that starts a :class:`LocalRay` for the run."""


@dataclass
class LocalRay:
    """A running two-node cluster this process is connected to.

    Attributes:
        address: its GCS address.
        node_a: the Ray node id of the head (resource ``node_a``).
        node_b: the Ray node id of the second node (resource ``node_b``).
    """

    cluster: Any
    address: str
    node_a: str
    node_b: str

    def shutdown(self) -> None:
        """Disconnect and stop both nodes."""
        import_ray().shutdown()
        self.cluster.shutdown()


def start_local_ray(cpus_per_node: int = 2) -> LocalRay:
    """Start node A and node B here and connect this process to them (blocks: seconds)."""
    ray = import_ray()
    cluster: Any = importlib.import_module("ray.cluster_utils").Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": cpus_per_node,
            "resources": {"node_a": 16},
            "include_dashboard": False,
        },
    )
    try:
        node_b = cluster.add_node(num_cpus=cpus_per_node, resources={"node_b": 16})
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
    except BaseException:
        ray.shutdown()
        cluster.shutdown()
        raise
    return LocalRay(cluster, cluster.address, cluster.head_node.node_id, node_b.node_id)
