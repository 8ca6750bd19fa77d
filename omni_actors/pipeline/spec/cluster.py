"""Where a pipeline's stages run when it outgrows one machine: the YAML of scale-out.

A pipeline-level ``cluster: {ray: {...}}`` names a Ray cluster; a stage's
``placement: {ray: {...}}`` says what one worker of it asks of that cluster. A placed
stage runs in worker processes started on the cluster's nodes (see
``omni_actors.cluster``); the stages without a placement run as declared, in the
server's process or in a local worker. Without ``cluster`` nothing changes.

Part of :mod:`omni_actors.pipeline.spec.pipeline` (which exports these names too).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from omni_actors.pipeline.spec.base import Spec

__all__ = ["ClusterSpec", "PlacementSpec", "RayClusterSpec", "RayPlacementSpec"]


class RayPlacementSpec(Spec):
    """What one worker of a stage asks of Ray: its placement-group bundle.

    ``num_gpus`` is Ray's to assign: a stage with ``device: cuda`` computes on the GPU
    Ray gave its worker (its ``CUDA_VISIBLE_DEVICES``). ``resources`` are custom Ray
    resources, and ``node_labels`` the labels a node must carry (``ray start --labels``):
    two ways to pin a stage to the nodes meant for it.
    """

    num_cpus: float = Field(1.0, ge=0, le=1024)
    num_gpus: float = Field(0.0, ge=0, le=64)
    resources: dict[str, float] = Field(default_factory=dict)
    node_labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_amounts(self) -> RayPlacementSpec:
        negative = sorted(name for name, amount in self.resources.items() if amount < 0)
        if negative:
            raise ValueError(f"resources must be >= 0; negative: {negative}")
        if self.num_cpus + self.num_gpus + sum(self.resources.values()) <= 0:
            raise ValueError("a placement asks for some CPU, GPU or resource")
        return self


class PlacementSpec(Spec):
    """Where a stage's workers run: ``ray`` (the only cluster kind)."""

    ray: RayPlacementSpec


class RayClusterSpec(Spec):
    """The Ray cluster of a pipeline.

    ``address``: ``auto`` (the cluster this machine belongs to), ``ray://host:port`` or
    ``host:port``; ignored if the process is connected to Ray already. ``strategy``:
    how the pipeline's bundles (one per placed stage worker) spread over nodes.
    ``bind``: the address the server's node listens on for its workers (default: this
    machine's address as Ray knows it). ``log_to_driver``: the workers' logs show in
    the server's output.
    """

    address: str = Field("auto", min_length=1)
    namespace: str | None = None
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    bind: str | None = None
    log_to_driver: bool = True


class ClusterSpec(Spec):
    """The cluster a pipeline's placed stages run on: ``ray`` (the only kind)."""

    ray: RayClusterSpec = RayClusterSpec()
