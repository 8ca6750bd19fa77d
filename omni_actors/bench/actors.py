"""Kernel benchmark: tell throughput against a bare ``asyncio.Queue``, ask latency.

Both the actor hop and the queue hop pay one coroutine call per message on the
receiving side, so the ratio isolates what the kernel adds: the type check, the two-lane
mailbox and the supervision-aware receive loop.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import sys
import time
from typing import Any

from omni_actors._actor import Actor
from omni_actors._system import ActorSystem

__all__ = ["run_actor_bench"]


class _Msg:
    __slots__ = ()


class _Sink(Actor[_Msg]):
    """Counts messages and resolves ``done`` at the expected count."""

    def __init__(self) -> None:
        self.count = 0
        self.expected = 0
        self.done: asyncio.Future[None] | None = None

    async def receive(self, message: _Msg) -> int:
        self.count += 1
        if self.count == self.expected and self.done is not None:
            self.done.set_result(None)
        return self.count


async def _tell_rate(system: ActorSystem, messages: int) -> float:
    ref = await system.spawn(_Sink)
    sink = ref._cell.instance
    assert isinstance(sink, _Sink)
    sink.expected = messages
    sink.done = asyncio.get_running_loop().create_future()
    message = _Msg()
    start = time.perf_counter()
    for _ in range(messages):
        await ref.tell(message)
    await sink.done
    elapsed = time.perf_counter() - start
    await system.stop(ref)
    return messages / elapsed


async def _queue_rate(messages: int, capacity: int) -> float:
    queue: asyncio.Queue[_Msg] = asyncio.Queue(maxsize=capacity)
    count = 0
    done = asyncio.get_running_loop().create_future()

    async def handle(message: _Msg) -> int:
        nonlocal count
        count += 1
        if count == messages:
            done.set_result(None)
        return count

    async def consume() -> None:
        while True:
            await handle(await queue.get())

    consumer = asyncio.get_running_loop().create_task(consume())
    message = _Msg()
    try:
        start = time.perf_counter()
        for _ in range(messages):
            await queue.put(message)
        await done
        elapsed = time.perf_counter() - start
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
    return messages / elapsed


async def _ask_latencies(system: ActorSystem, asks: int) -> list[float]:
    ref = await system.spawn(_Sink)
    message = _Msg()
    samples = []
    for _ in range(asks):
        start = time.perf_counter()
        await ref.ask(message)
        samples.append((time.perf_counter() - start) * 1e6)
    await system.stop(ref)
    return samples


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_actor_bench(messages: int, asks: int, repeat: int) -> dict[str, Any]:
    """Measure the kernel; ours and the baseline alternate so noise hits both."""
    capacity = _Sink.mailbox.capacity
    async with ActorSystem("bench") as system:
        await _tell_rate(system, min(messages, 10_000))  # warm-up
        await _queue_rate(min(messages, 10_000), capacity)
        tells, queues = [], []
        for _ in range(repeat):
            tells.append(await _tell_rate(system, messages))
            queues.append(await _queue_rate(messages, capacity))
        latencies = await _ask_latencies(system, asks)
    tell = statistics.median(tells)
    queue = statistics.median(queues)
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    return {
        "tell_per_s": round(tell),
        "queue_baseline_per_s": round(queue),
        "tell_vs_queue_ratio": round(queue / tell, 3),
        "ask_roundtrip_us_p50": round(_percentile(latencies, 0.5), 2),
        "ask_roundtrip_us_p99": round(_percentile(latencies, 0.99), 2),
        "messages": messages,
        "asks": asks,
        "repeat": repeat,
        "loop": loop,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()} x{os.cpu_count()}",
    }
