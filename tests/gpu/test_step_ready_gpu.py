"""Step marks on a GPU: a copy of a step's output, into a device link's slot or to the
host, waits for that step and not for the next one queued behind it on the same stream;
the copy of an output without a mark waits for everything queued before it."""

from __future__ import annotations

import pytest
import torch

from omni_actors.actors.engines.qwen3_omni.thinker_model import Fed
from omni_actors.cuda import HostStaging
from omni_actors.cuda.ipc import DeviceLink
from omni_actors.cuda.step_ready import mark_step

DEVICE = torch.device("cuda", 0)
NEXT_STEP_CYCLES = 2_000_000_000  # about a second of GPU clock: the next batch's forward


def next_step() -> torch.cuda.Event:
    """Queue a long kernel on the device's stream, as the model thread queues the next
    step; the event completes when it has run."""
    torch.cuda._sleep(NEXT_STEP_CYCLES)
    after = torch.cuda.Event()
    after.record(torch.cuda.current_stream(DEVICE))
    return after


def slot_bytes(link: DeviceLink, slot: int, nbytes: int) -> torch.Tensor:
    start = slot * link.slot_bytes
    return link.buffer.tensor[start : start + nbytes].cpu()


@pytest.mark.parametrize("returned", ["mapping", "records"])
async def test_a_marked_output_is_copied_while_the_next_step_still_runs(returned: str) -> None:
    """As a mapping, or as a step loop's records (the thinker's ``Fed`` per chunk)."""
    link = DeviceLink(DEVICE, slots=2, slot_bytes=1 << 20)
    staging = HostStaging(DEVICE, slots=2, slot_bytes=1 << 20)
    try:
        out = torch.randn(64, 64, device=DEVICE)
        expected = out.cpu()
        result = {"out": out} if returned == "mapping" else [Fed(out, None), Fed(None, None)]
        assert mark_step(result, DEVICE) is not None
        running = next_step()

        slices, _ = link.put({"row": out[3:4]})
        copied = torch.cuda.Event()
        copied.record(link.stream)
        transfer = staging.begin({"out": out})
        copied.synchronize()
        host = (await transfer.wait(staging.waiter))["out"]

        assert not running.query()  # both copies are done; the next step still runs
        assert link.unmarked == 0
        row = expected[3:4].contiguous().view(-1).view(torch.uint8)
        assert torch.equal(slot_bytes(link, slices["row"].slot, row.numel()), row)
        assert torch.equal(host, expected)
        running.synchronize()
    finally:
        link.close()
        await staging.close()


async def test_an_unmarked_output_waits_for_everything_queued_before_its_copy() -> None:
    link = DeviceLink(DEVICE, slots=2, slot_bytes=1 << 20)
    try:
        out = torch.randn(64, 64, device=DEVICE)
        running = next_step()

        link.put({"row": out[3:4]})
        copied = torch.cuda.Event()
        copied.record(link.stream)
        copied.synchronize()

        assert running.query()  # the copy waited for the kernel queued before it
        assert link.unmarked == 1  # counted, so a stage's unmarked outputs show
    finally:
        link.close()
