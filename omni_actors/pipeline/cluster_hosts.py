"""A pipeline's placed stages on its cluster: one bundle, and one host, per stage worker.

``OmniPipeline`` calls :func:`start_cluster` before it spawns the orchestrator (only
for a pipeline with a ``cluster``: this module is where serving meets Ray): the
placement group is reserved (or the start fails, naming what did not fit) before any
stage starts, and every placed stage actor (each replica) gets the ``WorkerHost`` of
its own bundle. ``close`` gives everything back after the stages stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

from omni_actors.cluster.ray_hosts import RayBundle, RayCluster
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.transport.worker_hosts import WorkerHost

__all__ = ["PipelineCluster", "pin", "start_cluster"]


@dataclass(slots=True)
class PipelineCluster:
    """The cluster share of one running pipeline.

    Attributes:
        cluster: its placement group and keepers.
        hosts: the worker host of each placed stage actor, by actor name.
    """

    cluster: RayCluster
    hosts: dict[str, WorkerHost]

    async def close(self) -> None:
        """Remove the placement group and any keeper left; disconnect if we connected."""
        await self.cluster.close()


async def start_cluster(spec: PipelineSpec) -> PipelineCluster | None:
    """Reserve a bundle per placed stage worker of ``spec`` (None: nothing is placed).

    Raises:
        ImportError: Ray is not installed.
        TimeoutError: the cluster found no room within ``deadlines.start_s``.
    """
    if spec.cluster is None:
        return None
    names: list[str] = []
    bundles: list[RayBundle] = []
    for stage in spec.stages:
        if stage.placement is None:
            continue
        ask = stage.placement.ray
        for name in stage.replica_names():
            names.append(name)
            bundles.append(
                RayBundle(ask.num_cpus, ask.num_gpus, dict(ask.resources), dict(ask.node_labels))
            )
    if not bundles:
        return None
    ray = spec.cluster.ray
    cluster = RayCluster(
        ray.address,
        bundles,
        namespace=ray.namespace,
        strategy=ray.strategy,
        bind=ray.bind,
        log_to_driver=ray.log_to_driver,
    )
    try:
        await cluster.start(spec.deadlines.start_s)
    except BaseException:
        await cluster.close()
        raise
    hosts: dict[str, WorkerHost] = {name: cluster.host(i) for i, name in enumerate(names)}
    return PipelineCluster(cluster, hosts)


def pin(spec: PipelineSpec, address: str, nodes: dict[str, str] | None = None) -> PipelineSpec:
    """``spec`` with every stage placed on a ``LocalRay`` (``omni_actors.cluster.local_ray``)
    at ``address``: by ``nodes`` (stage name → ``node_a`` or ``node_b``), else its entry
    stage on node A and every other stage on node B."""
    data = spec.model_dump(by_alias=True, exclude_none=True)
    entry = spec.entry_stage
    for stage in data["stages"]:
        default = "node_a" if stage["name"] == entry else "node_b"
        node = (nodes or {}).get(stage["name"], default)
        stage["placement"] = {"ray": {"resources": {node: 1}}}
    cluster = data.get("cluster", {}).get("ray", {})
    data["cluster"] = {"ray": {**cluster, "address": address, "log_to_driver": False}}
    return PipelineSpec.model_validate(data)
