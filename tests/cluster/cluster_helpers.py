"""What the scale-out tests read off a running pipeline and the cluster."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import Any

from omni_actors.cluster.ray_hosts import RayWorker
from omni_actors.protocols.events import AudioDelta, Event
from omni_actors.transport.process_placement import ProcessHost


def host_of(ref: Any) -> ProcessHost:
    """The stand-in actor of a stage actor in a worker, with its worker running."""
    host = ref._cell.instance
    assert isinstance(host, ProcessHost)
    assert host.worker is not None
    return host


def node_of(ref: Any) -> str:
    """The Ray node id a stage actor's worker runs on."""
    worker = host_of(ref).worker
    assert worker is not None
    assert isinstance(worker.proc, RayWorker)
    return worker.proc.node_id


async def events_of(
    session: AsyncIterable[Event], on_first_audio: Callable[[], object] | None = None
) -> list[Event]:
    """Every event of ``session``; ``on_first_audio`` runs once, at its first audio
    (the session is mid-stream on its audio stages then)."""
    events: list[Event] = []
    async for event in session:
        events.append(event)
        if on_first_audio is not None and isinstance(event, AudioDelta):
            on_first_audio()
            on_first_audio = None
    return events


def ours_alive() -> list[Any]:
    """Our keepers still alive on the cluster, and our placement groups not removed."""
    from ray._private import state  # the public state API needs Ray's dashboard
    from ray.util import placement_group_table

    actors = [
        a
        for a in state.actors().values()
        if a["ActorClassName"].endswith("WorkerKeeper") and a["State"] != "DEAD"
    ]
    groups = [
        g
        for g in placement_group_table().values()
        if g["name"].startswith("omni-actors-") and g["state"] != "REMOVED"
    ]
    return [*actors, *groups]
