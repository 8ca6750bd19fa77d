"""``bench cuda``'s ``link_ready`` row: how long after its step a step's output is in a
device link's slot, when the copy waits on the stream as the event loop finds it, and
when it waits on the step's mark (:mod:`omni_actors.cuda.step_ready`).

The producer's model thread runs decode steps back to back, as an engine does under
load: the loop starts the next step, and routes this step's output once the model
thread has queued the next forward on the device (another batch's forward, which the
model thread queues while the loop still routes this batch). It routes it a row at a
time (a session's row each, yielding between them as each session's task would) into
slots of a device link. The copy into the slot is what is timed, on the GPU, from an
event recorded right after the step to one recorded after the copy; nothing receives
the slots (they are given back at once). Two ways, taking turns in rounds:

- ``stream``: the rows carry no mark, so each copy waits for everything queued on the
  device's stream when the loop puts it: the next step's forward too;
- ``step``: the model thread marked its output, and each copy waits for that step only.

``next_step_ms_p50`` is the step time on the GPU (from one step's end to the next's),
what a copy that waits on the stream can lose.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

import torch

from omni_actors.bench.cuda_producer import Producer, dtype_of
from omni_actors.bench.stats import percentile
from omni_actors.cuda.ipc import DeviceLink

if TYPE_CHECKING:
    from omni_actors.bench.cuda import CudaBenchConfig

__all__ = ["measure_link_ready"]

_ROWS = 8  # sessions in the batch whose rows are routed one by one
_DEADLINE_S = 60.0
_WAYS = ("stream", "step")


async def measure_link_ready(config: CudaBenchConfig) -> dict[str, Any]:
    """``copy_after_step_ms_p50``/``p90`` of each way (see the module docstring), for
    ``config.steps`` decode steps each; needs CUDA (else a ``skipped`` reason)."""
    device = torch.device(config.device)
    if device.type != "cuda":
        return {"skipped": "needs CUDA"}
    size = "decode" if "decode" in config.sizes else config.sizes[0]
    rows = min(_ROWS, config.tokens(size))
    producer = Producer(config)
    link: DeviceLink | None = None
    delays: dict[str, list[float]] = {way: [] for way in _WAYS}
    steps: list[float] = []
    try:
        await producer.start()
        row_bytes = config.hidden * dtype_of(device).itemsize
        link = DeviceLink(device, slots=2, slot_bytes=row_bytes)
        for r in range(config.rounds):
            share = config.steps // config.rounds + (r < config.steps % config.rounds)
            for way in _WAYS if r % 2 == 0 else _WAYS[::-1]:
                copies, step_ms = await _run(producer, link, size, rows, way == "step", share)
                delays[way] += copies
                steps += step_ms
    finally:
        if link is not None:
            link.close()
        await producer.stop()
    result: dict[str, Any] = {"size": size, "rows": rows, "steps": config.steps}
    result["next_step_ms_p50"] = round(percentile(steps, 50), 4)
    for way, got in delays.items():
        result[way] = {
            "copy_after_step_ms_p50": round(percentile(got, 50), 4),
            "copy_after_step_ms_p90": round(percentile(got, 90), 4),
        }
    return result


async def _run(
    producer: Producer, link: DeviceLink, size: str, rows: int, mark: bool, steps: int
) -> tuple[list[float], list[float]]:
    """``warmup`` then ``steps`` steps, each routed as ``rows`` rows once the next one is
    queued: the measured copies' delays after their step, and the steps' times (ms)."""
    loop = asyncio.get_running_loop()
    total = producer.config.warmup + steps
    timed: list[tuple[Any, Any]] = []
    ends: list[Any] = []

    def start() -> tuple[asyncio.Future[tuple[torch.Tensor, Any]], asyncio.Future[None]]:
        launched: asyncio.Future[None] = loop.create_future()

        def queued() -> None:  # model thread
            loop.call_soon_threadsafe(launched.set_result, None)

        return producer.call(producer.routed_step, size, mark, queued), launched

    pending, _ = start()
    try:
        for i in range(total):
            async with asyncio.timeout(_DEADLINE_S):
                hidden, ended = await pending
                if i + 1 < total:  # the next step is queued before this one's rows leave
                    pending, launched = start()
                    # (a step that fails before it is queued raises at the next await)
                    await asyncio.wait((launched, pending), return_when=asyncio.FIRST_COMPLETED)
            ends.append(ended)
            for r in range(rows):
                slices, _ = link.put({"hidden": hidden[r : r + 1]})
                if not slices:
                    raise RuntimeError("the device link had no free slot")
                copied = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                copied.record(link.stream)
                # Nobody reads the slot: the next copy into it queues behind this one.
                link.release(tuple({piece.slot for piece in slices.values()}))
                if i >= producer.config.warmup:
                    timed.append((ended, copied))
                await asyncio.sleep(0)  # the next row is another session's task
    finally:
        pending.cancel()  # if still running, it finishes in the thread; stop() waits
    torch.cuda.synchronize(link.device)
    warm = ends[producer.config.warmup - 1 :]
    step_ms = [a.elapsed_time(b) for a, b in itertools.pairwise(warm)]
    return [ended.elapsed_time(copied) for ended, copied in timed], step_ms
