"""A worker that dies takes its shared-memory slab with it: the parent unmaps it (its
file descriptor and its mapping go), and the next worker's slab is used as before."""

from __future__ import annotations

import gc

import torch
from remote_actors import Echo, Payload

from omni_actors import Props
from omni_actors.testing import ActorTestKit, kill_worker
from omni_actors.transport.process_placement import ProcessPlacement

BIG = 1 << 19  # float32 elements: 2 MiB, past the slab threshold


async def test_a_killed_workers_slab_is_unmapped_and_the_next_workers_is_used() -> None:
    async with ActorTestKit(stop_timeout=2.0) as kit:
        ref = await kit.spawn(Echo, name="echo", props=Props(process=True))
        placement = kit.system._placements["process"]
        assert isinstance(placement, ProcessPlacement)
        node = placement.workers.node
        reply = await ref.ask(Payload(1, torch.ones(BIG)), timeout=30)  # through its slab
        assert torch.equal(reply.data, torch.ones(BIG))
        del reply
        gc.collect()
        mapped = set(node.slabs._slabs)
        assert mapped, "the worker's reply did not come through a slab"

        kill_worker(ref)
        await kit.eventually(lambda: not set(node.slabs._slabs) & mapped, what="slab unmapped")

        other = await kit.spawn(Echo, name="echo-2", props=Props(process=True))
        got = await other.ask(Payload(2, torch.full((BIG,), 2.0)), timeout=30)
        assert torch.equal(got.data, torch.full((BIG,), 2.0))
        assert set(node.slabs._slabs) - mapped, "the next worker's reply took no slab"
