"""Which receivers an outlet may hand device tensors to as they are: a stage in this
process, and nobody else — not an actor in a worker process (its messages are encoded),
and not the caller (it gets host memory wherever it runs)."""

from __future__ import annotations

from remote_actors import Echo

from omni_actors import Props
from omni_actors.actors.stage.outlet import Outlet
from omni_actors.protocols.stage import SessionKey
from omni_actors.testing import ActorTestKit


def outlet(ref: object, *, host: bool = False) -> Outlet:
    return Outlet(SessionKey("s#1"), "talker", "code2wav", ref, ("codes",), host=host)  # type: ignore[arg-type]


async def test_only_a_stage_in_this_process_takes_device_tensors() -> None:
    async with ActorTestKit() as kit:
        local = await kit.spawn(Echo, name="local")
        remote = await kit.spawn(Echo, name="remote", props=Props(process=True))
        assert outlet(local).takes_device
        assert not outlet(local, host=True).takes_device
        assert not outlet(remote).takes_device
