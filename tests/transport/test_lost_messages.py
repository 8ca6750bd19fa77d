"""Messages a worker had not taken when it died are counted and logged, never dropped
without a word: the parent's node counts what it sent and the worker never confirmed
taking (``Node.lost``), and the pipeline reports it (``OmniPipeline.transport_counts``)."""

from __future__ import annotations

import logging

import pytest
import torch
from remote_actors import Block, Echo, Payload

from omni_actors import Props
from omni_actors.testing import ActorTestKit, kill_worker
from omni_actors.transport.process_placement import ProcessPlacement


async def test_tells_a_dead_worker_never_took_are_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with ActorTestKit(stop_timeout=2.0) as kit:
        ref = await kit.spawn(Echo, name="echo", props=Props(process=True))
        placement = kit.system._placements["process"]
        assert isinstance(placement, ProcessPlacement)
        node = placement.workers.node
        # Taken and confirmed: nothing is lost with these.
        for seq in range(3):
            await ref.ask(Payload(seq, torch.zeros(1)), timeout=30)
        await ref.tell(Block(3600.0))  # busy from now on
        for seq in range(5):
            await ref.tell(Payload(seq, torch.zeros(1)))
        assert kit.system.placement_counts() == {"refused_frames": 0, "lost_messages": 0}
        with caplog.at_level(logging.WARNING, logger="omni_actors.transport.node"):
            kill_worker(ref)
            await kit.eventually(lambda: node.lost > 0, what="lost messages counted")
        # The block (taken, but not said to be: credits come back in batches) and the
        # 5 behind it; never the 3 answered asks (the worker takes messages in order).
        assert node.lost == 6
        assert kit.system.placement_counts()["lost_messages"] == node.lost
        assert any("at most that many were lost" in r.getMessage() for r in caplog.records)
