"""Transport benchmark: a payload ping plus a small ack between two processes.

Four ways to move the same float32 payload, measured in one run:

- ``ours``: ``ask`` to an actor in a worker process (``Props(process=True)``);
  large tensors go through the link's shared-memory slab, smaller ones as zero-copy
  ZeroMQ frames.
- ``baseline``: a connector shaped like vllm-omni's (pickle, a fresh shared-memory
  segment per message, name over a pipe, unpickle and unlink), run by
  ``benchmarks/vllm_omni_baseline.py`` — outside the package, which never pickles, so
  the bench finds it in a checkout (or where ``--baseline`` points) and says so loudly
  when it cannot, rather than reporting no baseline.
- ``raw_zmq``: the same bytes over a bare ZeroMQ PAIR socket pair, both sides blocking
  in ``recv``; ``raw_zmq_evented``: the same, but both sides wait in an event loop on the
  socket's file descriptor — the floor for any asyncio program that uses ZeroMQ.
- ``memcpy``: one in-process copy of the payload (the floor for moving it at all).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import zmq

from omni_actors import Actor, ActorSystem, Props
from omni_actors.bench.profiling import Profiler
from omni_actors.bench.stats import percentile
from omni_actors.errors import OmniError

__all__ = [
    "BASELINE_SCRIPT",
    "SIZES",
    "BaselineMissingError",
    "BenchEcho",
    "BenchPayload",
    "find_baseline",
    "run_transport_bench",
]

SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20}
BASELINE_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_omni_baseline.py"
"""Where a checkout keeps the baseline (an editable install runs from the checkout)."""


class BaselineMissingError(OmniError, FileNotFoundError):
    """The pickle baseline script is not where the bench was told to find it."""


def find_baseline(path: Path | None = None) -> Path:
    """The baseline script: ``path``, or the checkout's ``benchmarks/`` copy.

    Raises:
        BaselineMissingError: the script is not there; the message says what to pass.
    """
    script = BASELINE_SCRIPT if path is None else path
    if not script.is_file():
        raise BaselineMissingError(
            f"no pickle baseline script at {script}: it ships in the repository's "
            "benchmarks/ directory, not in the package (which never pickles). Run the bench "
            "from a checkout, pass --baseline PATH/TO/vllm_omni_baseline.py, or "
            "--no-baseline to measure without it"
        )
    return script


class BenchPayload(msgspec.Struct, tag=True, frozen=True):
    """The ping: a sequence number and the payload tensor."""

    seq: int
    data: torch.Tensor


class BenchEcho(Actor[BenchPayload]):
    """Acks each payload with its sequence number (the tensor is dropped at once)."""

    replies = int

    async def receive(self, message: BenchPayload) -> int:
        return message.seq


def _iterations(size: int, scale: float, iterations: int | None) -> tuple[int, int]:
    """Measured and warm-up round trips for one size: fewer for big payloads."""
    if iterations is not None:
        count = max(1, iterations)
    else:
        base = 400 if size <= 64 << 10 else 100 if size <= 1 << 20 else 30
        count = max(3, int(base * scale))
    return count, max(2, count // 10)


async def _ours(
    system: ActorSystem,
    sizes: dict[str, int],
    scale: float,
    iterations: int | None,
    profiler: Profiler | None,
) -> dict[str, list[float]]:
    """Round trips to one worker-process actor; one worker serves every size."""
    ref = await system.spawn(BenchEcho, name="bench-echo", props=Props(process=True))
    results: dict[str, list[float]] = {}
    for label, size in sizes.items():
        data = torch.from_numpy(np.random.default_rng(1).random(size // 4, dtype=np.float32))
        count, warmup = _iterations(size, scale, iterations)
        samples = []
        for i in range(warmup):
            await ref.ask(BenchPayload(i, data), timeout=30)
        with profiler.section() if profiler is not None else contextlib.nullcontext():
            for i in range(warmup, warmup + count):
                start = time.perf_counter()
                await ref.ask(BenchPayload(i, data), timeout=30)
                samples.append((time.perf_counter() - start) * 1e6)
        results[label] = samples
    await system.stop(ref)
    return results


async def _raw_zmq(size: int, count: int, warmup: int, *, evented: bool) -> list[float]:
    """Ping-pong raw bytes; ``evented`` waits in the event loop on both sides."""
    rundir = tempfile.mkdtemp(prefix="omni-actors-bench-")
    endpoint = f"ipc://{rundir}/raw"
    ctx = zmq.Context()
    socket = ctx.socket(zmq.PAIR)
    socket.bind(endpoint)
    args = [sys.executable, "-m", "omni_actors.bench.zmq_peer", endpoint]
    peer = subprocess.Popen([*args, "--async"] if evented else args)  # noqa: ASYNC220 - a bench
    payload = np.random.default_rng(2).random(size // 4, dtype=np.float32).data.cast("B")
    loop = asyncio.get_running_loop()
    acks: asyncio.Queue[None] = asyncio.Queue()

    def readable() -> None:
        while int(socket.get(zmq.EVENTS)) & int(zmq.POLLIN):
            socket.recv(zmq.NOBLOCK)
            acks.put_nowait(None)

    if evented:
        loop.add_reader(socket.FD, readable)
    samples = []
    try:
        for i in range(warmup + count):
            start = time.perf_counter()
            socket.send(payload, copy=False)
            if evented:
                readable()  # a send can consume the FD's edge: look before waiting
                await acks.get()
            else:
                socket.recv()
            if i >= warmup:
                samples.append((time.perf_counter() - start) * 1e6)
        socket.send(b"")
        await asyncio.to_thread(peer.wait, 30)
    finally:
        if evented:
            loop.remove_reader(socket.FD)
        if peer.poll() is None:
            peer.kill()
            peer.wait()
        socket.close(linger=0)
        ctx.term()
        shutil.rmtree(rundir, ignore_errors=True)
    return samples


def _baseline(script: Path | None, size: int, count: int, warmup: int) -> list[float] | None:
    """Run the pickle+shm baseline script; it times itself, so startup is excluded."""
    if script is None:
        return None  # --no-baseline
    done = subprocess.run(
        [sys.executable, str(script), str(size), str(count), str(warmup)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} failed:\n{done.stderr}")
    samples: list[float] = json.loads(done.stdout)["us"]
    return samples


def _memcpy(size: int, count: int) -> list[float]:
    """Time one in-process copy between preallocated arrays."""
    src = np.random.default_rng(0).random(size // 4, dtype=np.float32)
    dst = np.empty_like(src)
    samples = []
    for _ in range(count + 3):
        start = time.perf_counter()
        np.copyto(dst, src)  # one single-threaded copy, as the slab's copy-in
        samples.append((time.perf_counter() - start) * 1e6)
    return samples[3:]


async def run_transport_bench(
    sizes: list[str],
    scale: float = 1.0,
    iterations: int | None = None,
    baseline: Path | None = BASELINE_SCRIPT,
    profiler: Profiler | None = None,
) -> dict[str, Any]:
    """Measure every variant for each size label in ``sizes``.

    ``iterations`` fixes the measured round trips per size; without it each size gets
    a default count (fewer for large payloads) multiplied by ``scale``. ``baseline`` is
    the pickle baseline script (see :func:`find_baseline`); None skips that variant.
    ``profiler`` profiles this process's side of the measured ``ours`` round trips;
    the report then has ``profile``.
    """
    if baseline is not None:
        baseline = find_baseline(baseline)  # fail before measuring anything
    chosen = {label: SIZES[label] for label in sizes}
    async with ActorSystem("bench") as system:
        ours = await _ours(system, chosen, scale, iterations, profiler)
    table: dict[str, Any] = {}
    for label, size in chosen.items():
        count, warmup = _iterations(size, scale, iterations)
        raw = await _raw_zmq(size, count, warmup, evented=False)
        raw_evented = await _raw_zmq(size, count, warmup, evented=True)
        base = _baseline(baseline, size, count, warmup)
        copy = _memcpy(size, count)
        ours_p50 = percentile(ours[label], 50)
        row: dict[str, Any] = {
            "ours_us_p50": round(ours_p50, 1),
            "ours_us_p99": round(percentile(ours[label], 99), 1),
            "baseline_us_p50": None if base is None else round(percentile(base, 50), 1),
            "raw_zmq_us_p50": round(percentile(raw, 50), 1),
            "raw_zmq_evented_us_p50": round(percentile(raw_evented, 50), 1),
            "memcpy_us_p50": round(percentile(copy, 50), 1),
            "iterations": count,
        }
        row["speedup_vs_baseline"] = (
            None if base is None else round(row["baseline_us_p50"] / ours_p50, 2)
        )
        row["overhead_vs_raw_zmq"] = round(ours_p50 / row["raw_zmq_us_p50"], 2)
        row["overhead_vs_raw_zmq_evented"] = round(ours_p50 / row["raw_zmq_evented_us_p50"], 2)
        row["ratio_vs_memcpy"] = round(ours_p50 / row["memcpy_us_p50"], 2)
        table[label] = row
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "pyzmq": zmq.__version__,
        },
        "baseline": "skipped" if baseline is None else str(baseline),
        "sizes": table,
    }
    if profiler is not None:
        report["profile"] = profiler.report()
    return report
