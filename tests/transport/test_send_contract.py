"""The send contract: once ``tell`` returns, the sender may change what it sent.

Tensors leave a process without a copy on the receiving side, which tempts a sender to
skip the copy on its own side too — but ZeroMQ sends a ``copy=False`` frame from its
I/O thread *after* ``send`` returns, so a tensor changed right after ``tell`` could
reach the receiver half changed. Each size below takes another path out of the
process: a frame of its own (below the shared-memory threshold), the shared-memory
slab, and a frame again for a tensor larger than a slab slot.
"""

from __future__ import annotations

import pytest
import torch
from remote_actors import Count, Payload, Smallest

from omni_actors import Props
from omni_actors.testing import ActorTestKit
from omni_actors.transport.shm import SlabWriter

SLOT_BYTES = SlabWriter.create.__defaults__[1]  # type: ignore[index]


@pytest.mark.parametrize(
    "nbytes",
    [256 << 10, 4 << 20, SLOT_BYTES + (16 << 20)],
    ids=["frame", "slab", "larger-than-a-slot"],
)
async def test_a_tensor_changed_right_after_tell_arrives_as_it_was_sent(nbytes: int) -> None:
    sends = 6
    async with ActorTestKit(stop_timeout=5.0) as kit:
        ref = await kit.spawn(Smallest, name="smallest", props=Props(process=True))
        for seq in range(sends):
            data = torch.ones(nbytes // 4)
            await ref.tell(Payload(seq, data), timeout=30)
            data.fill_(0.0)  # the sender reuses its buffer at once
        assert await ref.ask(Count(), timeout=60) == [1.0] * sends
