"""``EventWaiter`` with real CUDA events: side-stream device-to-host copies into pinned
memory resolve in order, bit for bit, while the event loop keeps running."""

from __future__ import annotations

import asyncio

import torch

from omni_actors.cuda import EventWaiter

SLOT = 4 << 20


def busy_gpu(ms: float) -> None:
    """Queue about ``ms`` of work on the current stream (a chain of matrix products)."""
    a = torch.randn(4096, 4096, device="cuda")
    torch.tanh(a @ a)  # warm-up: library start-up is not the product's time
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.tanh(a @ a)
    end.record()
    end.synchronize()
    each = max(start.elapsed_time(end) / 10, 1e-3)
    for _ in range(max(1, int(ms / each))):
        a = torch.tanh(a @ a)


def copy_to(pinned: torch.Tensor, src: torch.Tensor, side: torch.cuda.Stream) -> torch.cuda.Event:
    """``pinned.copy_(src)`` on ``side`` once the compute stream's work so far is done."""
    ready = torch.cuda.Event()
    ready.record()
    side.wait_event(ready)
    with torch.cuda.stream(side):
        src.record_stream(side)
        pinned.copy_(src, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
    return done


async def test_side_stream_copies_resolve_in_order_and_bit_for_bit() -> None:
    waiter = EventWaiter()
    side = torch.cuda.Stream()
    pinned = torch.zeros(8, SLOT, dtype=torch.uint8, pin_memory=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sources = [
        torch.randint(1, 256, (SLOT,), dtype=torch.uint8, device="cuda", generator=gen)
        for _ in range(8)
    ]
    expected = [src.cpu() for src in sources]  # read before any copy is queued
    busy_gpu(100)  # the copies wait behind this: a future resolved early sees zeros
    order: list[int] = []
    futures = []
    for i, src in enumerate(sources):
        future = waiter.wait(copy_to(pinned[i], src, side))
        future.add_done_callback(lambda _, i=i: order.append(i))  # type: ignore[misc]
        futures.append(future)
    await asyncio.wait_for(asyncio.gather(*futures), 30)
    assert order == list(range(8))
    for i in range(8):  # host memory only: nothing here waits for the device
        assert torch.equal(pinned[i], expected[i])
    await waiter.close()


async def test_the_loop_runs_while_the_copy_waits_behind_device_work() -> None:
    waiter = EventWaiter()
    side = torch.cuda.Stream()
    pinned = torch.empty(SLOT, dtype=torch.uint8, pin_memory=True)
    src = torch.full((SLOT,), 7, dtype=torch.uint8, device="cuda")
    busy_gpu(200)  # the copy waits for this on the compute stream
    future = waiter.wait(copy_to(pinned, src, side))
    loop = asyncio.get_running_loop()
    turns = 0

    def tick() -> None:  # a callback per loop turn until the copy is done
        nonlocal turns
        turns += 1
        if not future.done():
            loop.call_soon(tick)

    loop.call_soon(tick)
    await asyncio.wait_for(future, 30)
    assert turns > 100  # the loop kept turning while the device worked
    assert bool((pinned == 7).all())
    await waiter.close()
