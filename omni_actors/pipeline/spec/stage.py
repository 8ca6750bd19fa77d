"""One stage of a pipeline definition: its engine, placement and transfers.

Part of :mod:`omni_actors.pipeline.spec.pipeline` (which exports these names too).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from omni_actors.actors.engines.torch_engine import DEVICE_PATTERN
from omni_actors.pipeline.spec.base import Spec
from omni_actors.pipeline.spec.cluster import PlacementSpec
from omni_actors.supervision import RestartType

__all__ = ["NAME_PATTERN", "EngineSpec", "StageSpec", "StagingSpec"]

NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"


class EngineSpec(Spec):
    """Which engine a stage hosts and its arguments (validated by the engine's ``Args``).

    ``kind`` is a registered engine (``scripted``, a model family's ``qwen3-omni.talker``,
    a third party's entry point) or an importable class, ``package.module:Class``.
    """

    kind: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class StagingSpec(Spec):
    """Host memory a GPU stage copies its tensors through (``omni_actors.cuda``).

    Allocated once when the stage starts, page-locked: ``slots`` slots of
    ``slot_bytes``. A tensor that finds no free slot, or is bigger than one, gets an
    allocation of its own (slower, never blocked). Each device link the stage sends on
    has ``link_slots`` slots of ``slot_bytes`` on its GPU; a message takes a run of
    them. ``copies: sync`` turns the streams off (``.cpu()`` and ``.to(device)`` where
    the tensors cross), the baseline to measure against.
    """

    slots: int = Field(8, ge=1, le=4096)
    slot_bytes: int = Field(2 << 20, ge=4096, le=1 << 34)
    link_slots: int = Field(32, ge=1, le=65536)
    copies: Literal["async", "sync"] = "async"


class StageSpec(Spec):
    """One stage: a ``StageActor`` hosting one engine.

    ``restart`` is its restart type: ``permanent`` (always restarted), ``transient``
    (restarted after a failure, not after a normal stop) or ``temporary`` (never).
    ``device`` places the engine (``cpu``, ``cuda``, ``cuda:1``, or ``auto``: a GPU if
    there is one); it becomes the engine's ``device`` argument, so only engines that
    take one accept it. ``devices`` places each replica instead, one device apiece
    (``[cuda:0, cuda:1]``: two replicas; ``replicas`` may be left out). ``staging``
    sizes the host memory of its GPU transfers.
    ``placement`` puts its workers on the pipeline's cluster (``cluster_spec``); they
    are worker processes there, whatever ``process`` says.
    """

    name: str = Field(pattern=NAME_PATTERN)
    engine: EngineSpec
    process: bool = False
    replicas: int = Field(1, ge=1, le=64)
    restart: RestartType = "permanent"
    device: str | None = Field(None, pattern=DEVICE_PATTERN)
    devices: tuple[Annotated[str, Field(pattern=DEVICE_PATTERN)], ...] | None = Field(
        None, min_length=1, max_length=64
    )
    staging: StagingSpec = StagingSpec()
    placement: PlacementSpec | None = None

    def replica_names(self) -> list[str]:
        """The actor name of each replica: the stage's, suffixed with its index when
        there are several."""
        if self.replicas == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(self.replicas)]

    def replica_devices(self) -> list[str | None]:
        """Where each replica computes, in :meth:`replica_names` order (None: where its
        engine's arguments say)."""
        if self.devices is not None:
            return list(self.devices)
        return [self.device] * self.replicas

    def replica_args(self, index: int) -> dict[str, Any]:
        """The engine arguments of replica ``index``: the stage's, with that replica's
        device where ``devices`` places each replica."""
        args = dict(self.engine.args)
        if self.devices is not None:
            args["device"] = self.devices[index]
        return args

    def computes_on_gpu(self) -> bool:
        """Whether every replica is placed on a GPU (``auto`` counts: its link offer
        finds out, and falls back)."""
        return all(d is not None and d != "cpu" for d in self.replica_devices())

    @model_validator(mode="after")
    def _place_engine(self) -> StageSpec:
        if self.placement is not None:
            # Placed on a cluster: its workers are processes there, whatever ``process``.
            object.__setattr__(self, "process", True)
        if self.devices is not None:
            return self._place_replicas(self.devices)
        # The device reaches the engine as its ``device`` argument: one value, one place.
        if self.device is None:
            return self
        given = self.engine.args.get("device")
        if given is not None and given != self.device:
            raise ValueError(
                f"device {self.device!r} contradicts engine.args.device {given!r}; keep one"
            )
        args = {**self.engine.args, "device": self.device}
        object.__setattr__(self, "engine", self.engine.model_copy(update={"args": args}))
        return self

    def _place_replicas(self, devices: tuple[str, ...]) -> StageSpec:
        # Each replica's device reaches its engine as ``device`` when it is spawned
        # (``replica_args``); one value per replica, so no other may be given.
        if self.device is not None:
            raise ValueError(
                "device and devices are both set: devices places each replica, device "
                "all of them; keep one"
            )
        if "device" in self.engine.args:
            raise ValueError(
                "devices places each replica, so engine.args.device cannot be set too; remove it"
            )
        if "replicas" in self.model_fields_set and self.replicas != len(devices):
            raise ValueError(
                f"replicas is {self.replicas} but devices names {len(devices)}: one device "
                "per replica (replicas may be left out)"
            )
        object.__setattr__(self, "replicas", len(devices))
        return self
