"""Stage workers on a Ray cluster: a placement group per pipeline, a keeper per worker.

:class:`RayCluster` is one pipeline's share of a cluster: the connection (``ray.init``
unless the program is connected already), one placement group with a bundle per stage
worker (the stage's ``placement.ray`` resources, the pipeline's strategy), and the
keepers it started. :meth:`RayCluster.host` gives the ``WorkerHost`` of one bundle,
which a process actor's ``Props.host`` names: the process placement then starts the
worker through a keeper in that bundle and links to it over TCP with CURVE.

Restarts: a worker that dies (or whose node is removed) fails its stage; when the
supervisor restarts it, a new keeper is asked for in the *same bundle*. If the node is
gone, Ray reschedules the lost bundle on a node that fits it under the group's
strategy, and the keeper starts there; if none fits, the restart fails at the
pipeline's start deadline and the supervisor decides (its restart intensity).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omni_actors.cluster.ray_keeper import WorkerKeeper
from omni_actors.transport.worker_hosts import TcpNetwork, WorkerLaunch

__all__ = ["RayBundle", "RayCluster", "RayHost", "RayWorker", "import_ray"]

log = logging.getLogger(__name__)

_KEEPER_THREADS = 4  # start/wait block a thread each; release, kill, cleanup need one
_CLEANUP_S = 10.0
_names = itertools.count(1)


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError that says how to get it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "a pipeline with 'cluster: {ray: ...}' needs Ray: pip install 'omni-actors[ray]'"
        ) from exc
    return ray


@dataclass(frozen=True, slots=True)
class RayBundle:
    """What one stage worker asks of Ray (its bundle, and its keeper's options)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    node_labels: Mapping[str, str] = field(default_factory=dict)

    def bundle(self) -> dict[str, float]:
        """The placement-group bundle."""
        out = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        return {name: amount for name, amount in out.items() if amount > 0}


async def _get(ref: Any) -> Any:
    """Await a Ray ObjectRef on any event loop (uvloop's too)."""
    return await asyncio.wrap_future(ref.future())


class RayCluster:
    """One pipeline's placement group on a Ray cluster, and the keepers in it.

    Args:
        address: the cluster (``auto``, ``ray://host:port``, ``host:port``); ignored if
            this process is connected to Ray already.
        bundles: one per stage worker, in the order of :meth:`host`'s indices.
        namespace: Ray namespace of the keepers.
        strategy: the placement group's strategy (``PACK``, ``SPREAD``,
            ``STRICT_PACK``, ``STRICT_SPREAD``).
        bind: the address this process's node listens on for the workers; None: this
            node's address as Ray knows it.
        log_to_driver: stream the workers' logs (their stderr) to this process.
    """

    def __init__(
        self,
        address: str,
        bundles: list[RayBundle],
        *,
        namespace: str | None = None,
        strategy: str = "PACK",
        bind: str | None = None,
        log_to_driver: bool = True,
    ) -> None:
        if not bundles:
            raise ValueError("a RayCluster places at least one stage worker")
        self.address = address
        self.bundles = bundles
        self.namespace = namespace
        self.strategy = strategy
        self._bind = bind
        self._log_to_driver = log_to_driver
        self.network = TcpNetwork(bind or "127.0.0.1")
        self.group: Any = None
        self._connected_here = False
        self._keepers: set[Any] = set()

    async def start(self, timeout: float) -> None:
        """Connect, then reserve every bundle (within ``timeout`` seconds).

        Raises:
            TimeoutError: the cluster has no room for every bundle.
        """
        ray = import_ray()
        if not ray.is_initialized():
            await asyncio.to_thread(
                ray.init,
                address=self.address,
                namespace=self.namespace,
                log_to_driver=self._log_to_driver,
                configure_logging=False,
            )
            self._connected_here = True
        from ray.util.placement_group import placement_group

        self.network = TcpNetwork(self._bind or str(ray.util.get_node_ip_address()))
        labels = [dict(b.node_labels) for b in self.bundles]
        self.group = placement_group(
            [b.bundle() for b in self.bundles],
            strategy=self.strategy,
            name=f"omni-actors-{next(_names)}",
            bundle_label_selector=labels if any(labels) else None,
        )
        try:
            async with asyncio.timeout(timeout):
                await _get(self.group.ready())
        except TimeoutError:
            raise TimeoutError(
                f"the Ray cluster found no room for {len(self.bundles)} stage worker(s) "
                f"({[b.bundle() for b in self.bundles]}, labels {labels}, {self.strategy}) "
                f"within {timeout}s"
            ) from None

    def host(self, index: int) -> RayHost:
        """The worker host of bundle ``index``."""
        if not 0 <= index < len(self.bundles):
            raise IndexError(f"bundle {index} of {len(self.bundles)}")
        return RayHost(self, index)

    def new_keeper(self, index: int) -> Any:
        """A keeper actor in bundle ``index``, with that bundle's resources."""
        ray = import_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.group is None:
            raise RuntimeError("the cluster is not started")
        bundle = self.bundles[index]
        keeper = (
            ray.remote(WorkerKeeper)
            .options(
                num_cpus=bundle.num_cpus,
                num_gpus=bundle.num_gpus,
                resources=dict(bundle.resources),
                max_concurrency=_KEEPER_THREADS,
                max_restarts=0,  # the stage's supervisor restarts it, in this bundle
                namespace=self.namespace,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, index),
            )
            .remote()
        )
        self._keepers.add(keeper)
        return keeper

    def forget(self, keeper: Any) -> None:
        """``keeper`` is killed: stop tracking it."""
        self._keepers.discard(keeper)

    async def close(self) -> None:
        """Kill the keepers left, remove the placement group, disconnect if we did."""
        if self.group is None and not self._connected_here:
            return
        ray = import_ray()
        for keeper in list(self._keepers):
            with contextlib.suppress(Exception):
                ray.kill(keeper, no_restart=True)
        self._keepers.clear()
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.group = None
        if self._connected_here:
            self._connected_here = False
            await asyncio.to_thread(ray.shutdown)


@dataclass(frozen=True, slots=True)
class RayHost:
    """Starts a stage worker through a keeper in one bundle of a :class:`RayCluster`."""

    cluster: RayCluster
    index: int

    @property
    def network(self) -> TcpNetwork:
        """The cluster's TCP network."""
        return self.cluster.network

    async def start(self, launch: WorkerLaunch) -> RayWorker:
        """Ask for a keeper in the bundle and have it start the worker."""
        keeper = self.cluster.new_keeper(self.index)
        try:
            pid, line, node_id = await _get(keeper.start.remote(launch.argv(None)))
        except BaseException:
            import_ray().kill(keeper, no_restart=True)
            self.cluster.forget(keeper)
            raise
        return RayWorker(self.cluster, keeper, pid, line, node_id)


class RayWorker:
    """A stage worker started by a keeper on a node of the cluster."""

    def __init__(self, cluster: RayCluster, keeper: Any, pid: int, line: str, node_id: str) -> None:
        self.node_id = node_id  # the Ray node it runs on
        self._cluster = cluster
        self._keeper = keeper
        self._pid = pid
        self._line = line
        self._exit: asyncio.Future[int] | None = None
        self._abandon: asyncio.TimerHandle | None = None

    @property
    def pid(self) -> int:
        """Its process id on its node."""
        return self._pid

    @property
    def returncode(self) -> int | None:
        """Its exit status (-1: lost with its keeper or node); None while it runs."""
        exit_ = self._exit
        if exit_ is None or not exit_.done() or exit_.cancelled():
            return None
        return exit_.result()

    async def wait(self) -> int:
        """Wait for it to exit, or for its keeper (its node) to be lost."""
        if self._exit is None:
            self._exit = asyncio.ensure_future(self._watch())
        return await asyncio.shield(self._exit)

    async def _watch(self) -> int:
        ray = import_ray()
        try:
            return int(await _get(self._keeper.wait.remote()))
        except ray.exceptions.RayActorError as exc:
            log.warning("stage worker %d lost with its keeper: %s", self._pid, exc)
            return -1

    async def announcement(self) -> str:
        """The line it announced itself with."""
        return self._line

    def release(self) -> None:
        """Have the keeper close its stdin."""
        self._keeper.release.remote()

    def kill(self) -> None:
        """Have the keeper SIGKILL it; if the keeper has not answered within a few
        seconds (its node unreachable), kill the keeper through Ray, which ends
        :meth:`wait` too: the parent never waits on a node that cannot answer."""
        self._keeper.kill.remote()
        if self._abandon is None:
            loop = asyncio.get_running_loop()
            self._abandon = loop.call_later(_CLEANUP_S, self._kill_keeper)

    def _kill_keeper(self) -> None:
        import_ray().kill(self._keeper, no_restart=True)

    async def cleanup(self) -> None:
        """Have the keeper end its group and sweep its slabs; then kill the keeper."""
        ray = import_ray()
        try:
            async with asyncio.timeout(_CLEANUP_S):
                await _get(self._keeper.cleanup.remote())
        except (TimeoutError, ray.exceptions.RayActorError):
            pass  # lost with its node: nothing left there to clean
        finally:
            if self._abandon is not None:
                self._abandon.cancel()
            ray.kill(self._keeper, no_restart=True)
            self._cluster.forget(self._keeper)
            if self._exit is not None and not self._exit.done():
                self._exit.cancel()
