"""Kernel benchmark: tell throughput against a bare ``asyncio.Queue``, ask latency.

Both the actor hop and the queue hop pay one coroutine call per message on the
receiving side, so the ratio isolates what the kernel adds: the type check, the two-lane
mailbox and the supervision-aware receive loop. Ours and the baseline run in the same
process and event loop, alternating within each repeat, so machine noise hits both.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import statistics
import sys
import time
from typing import Any

from omni_actors._actor import Actor
from omni_actors._system import ActorSystem
from omni_actors.bench.stats import percentile

__all__ = ["run_actor_bench"]

_WARMUP_MESSAGES = 10_000
_WARMUP_ASKS = 1_000


class _Msg:
    __slots__ = ()


class _Counter(Actor[_Msg]):
    """Counts messages; resolves ``done`` at the ``expected``-th one; replies the count."""

    def __init__(self, expected: int, done: asyncio.Future[None] | None) -> None:
        self.count = 0
        self.expected = expected
        self.done = done

    async def receive(self, message: _Msg) -> int:
        self.count += 1
        if self.count == self.expected and self.done is not None:
            self.done.set_result(None)
        return self.count


async def _tell_rate(system: ActorSystem, messages: int) -> float:
    """Messages per second from the first ``tell`` to the last ``receive``."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ref = await system.spawn(_Counter, messages, done)
    message = _Msg()
    try:
        start = time.perf_counter()
        for _ in range(messages):
            await ref.tell(message)
        await done
        elapsed = time.perf_counter() - start
    finally:
        await system.stop(ref)
    return messages / elapsed


async def _queue_rate(messages: int, capacity: int) -> float:
    """The same hop through a bare bounded queue and one consumer task."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[_Msg] = asyncio.Queue(maxsize=capacity)
    done: asyncio.Future[None] = loop.create_future()
    count = 0

    async def handle(message: _Msg) -> int:
        nonlocal count
        count += 1
        if count == messages:
            done.set_result(None)
        return count

    async def consume() -> None:
        while True:
            await handle(await queue.get())

    consumer = loop.create_task(consume(), name="bench queue consumer")
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


async def _ask_latencies_us(system: ActorSystem, asks: int) -> list[float]:
    """Round-trip time of ``asks`` sequential asks, in microseconds."""
    ref = await system.spawn(_Counter, 0, None)
    message = _Msg()
    samples: list[float] = []
    try:
        for _ in range(asks):
            start = time.perf_counter()
            await ref.ask(message)
            samples.append((time.perf_counter() - start) * 1e6)
    finally:
        await system.stop(ref)
    return samples


async def run_actor_bench(messages: int, asks: int, repeat: int) -> dict[str, Any]:
    """Measure tell throughput, the queue baseline and ask latency of the kernel.

    Must run inside an event loop (the CLI uses ``omni_actors.run``, i.e. uvloop when
    installed). Each number is the median over ``repeat`` runs, after a warm-up.

    Args:
        messages: tells (and queue puts) per run.
        asks: sequential asks per run.
        repeat: runs; the median of each measure is reported.

    Returns:
        A JSON-ready dict: ``tell_per_s``, ``queue_baseline_per_s``,
        ``tell_vs_queue_ratio`` (baseline / ours: how many times slower ``tell`` is),
        ``ask_roundtrip_us_p50``/``_p99``, and the run's parameters and machine.
    """
    if min(messages, asks, repeat) < 1:
        raise ValueError(
            f"messages, asks and repeat must be >= 1, got {messages}, {asks}, {repeat}"
        )
    capacity = _Counter.mailbox.capacity
    tells: list[float] = []
    queues: list[float] = []
    p50s: list[float] = []
    p99s: list[float] = []
    async with ActorSystem("bench") as system:
        await _tell_rate(system, min(messages, _WARMUP_MESSAGES))
        await _queue_rate(min(messages, _WARMUP_MESSAGES), capacity)
        await _ask_latencies_us(system, min(asks, _WARMUP_ASKS))
        for run in range(repeat):
            # Alternate which side goes first so neither always gets the warmer cache.
            order = ("tell", "queue") if run % 2 == 0 else ("queue", "tell")
            for side in order:
                gc.collect()  # a collection mid-run would land on one side only
                if side == "tell":
                    tells.append(await _tell_rate(system, messages))
                else:
                    queues.append(await _queue_rate(messages, capacity))
            gc.collect()
            latencies = await _ask_latencies_us(system, asks)
            p50s.append(percentile(latencies, 50))
            p99s.append(percentile(latencies, 99))
    tell = statistics.median(tells)
    queue = statistics.median(queues)
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    return {
        "tell_per_s": round(tell),
        "queue_baseline_per_s": round(queue),
        "tell_vs_queue_ratio": round(queue / tell, 3),
        "ask_roundtrip_us_p50": round(statistics.median(p50s), 2),
        "ask_roundtrip_us_p99": round(statistics.median(p99s), 2),
        "messages": messages,
        "asks": asks,
        "repeat": repeat,
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "loop": loop,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
    }
