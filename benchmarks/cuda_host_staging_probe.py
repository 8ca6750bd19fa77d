"""Where should the pinned memory of a GPU -> process hand-off live? A measurement.

Three ways to move a tensor that a GPU stage produced into another process:

- ``pageable``: ``tensor.cpu()`` (the compute stream waits), then a copy into the
  shared-memory slot the receiver maps;
- ``pinned_ring``: an async device-to-host copy on a side stream into a pinned slot
  allocated once, then a host copy into the shared-memory slot;
- ``registered_shm``: the shared-memory slab itself registered as pinned memory
  (``cudaHostRegister``), so the device-to-host copy lands in the slot the receiver maps,
  and the receiver, which registers its own mapping, copies host-to-device from it
  asynchronously.

For each size it reports the hop latency (GPU data ready in the producer -> the same
bytes on the GPU in the receiver, checked bit for bit) and the cost to a loop of
forward-sized steps that hands each step's output off (``step_ms_p50`` per mode; the
waiting is done by a thread, as a stage's event loop would have it). Needs one CUDA GPU,
torch and numpy only. Usage: ``python benchmarks/cuda_host_staging_probe.py OUT.json``.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch

SIZES = {"256KiB": 256 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20}
HOPS = 200
STEPS = 300
SLOTS = 4


def register(buffer: memoryview) -> int:
    """Pin ``buffer`` for CUDA; returns its address (0 if the driver refused)."""
    array = np.frombuffer(buffer, dtype=np.uint8)
    address = array.ctypes.data
    error = torch.cuda.cudart().cudaHostRegister(address, array.nbytes, 0)
    return address if int(getattr(error, "value", error)) == 0 else 0


def unregister(address: int) -> None:
    if address:
        torch.cuda.cudart().cudaHostUnregister(address)


def payload(seed: int, nbytes: int, device: str) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=gen)


def receiver(name: str, nbytes: int, registered: bool, conn: Any) -> None:
    """Map the slab; per message (slot, seed): H2D the slot, check it, report the time."""
    torch.cuda.init()
    shm = shared_memory.SharedMemory(name=name)
    address = register(shm.buf) if registered else 0
    host = torch.frombuffer(shm.buf, dtype=torch.uint8)
    stream = torch.cuda.Stream()
    conn.send(("ready", bool(address) or not registered))
    try:
        while (message := conn.recv()) is not None:
            slot, seed = message
            view = host[slot * nbytes : (slot + 1) * nbytes]
            with torch.cuda.stream(stream):
                on_gpu = view.to("cuda", non_blocking=True)
            stream.synchronize()
            done = time.perf_counter()
            exact = bool(torch.equal(on_gpu, payload(seed, nbytes, "cuda")))
            conn.send((done, exact))
    finally:
        view = host = None  # drop the buffer's exports before closing it
        unregister(address)
        with contextlib.suppress(BufferError):
            shm.close()


class Producer:
    """One mode's producer side: stages a GPU tensor into slab slot ``slot``."""

    def __init__(self, mode: str, shm: shared_memory.SharedMemory, nbytes: int) -> None:
        self.mode, self.nbytes = mode, nbytes
        self.slab = torch.frombuffer(shm.buf, dtype=torch.uint8)
        self.address = register(shm.buf) if mode == "registered_shm" else 0
        if mode == "registered_shm" and not self.address:
            raise RuntimeError("cudaHostRegister refused the shared-memory slab")
        self.ring = (
            torch.empty(SLOTS * nbytes, dtype=torch.uint8, pin_memory=True)
            if mode == "pinned_ring"
            else None
        )
        self.side = torch.cuda.Stream()

    def start(self, tensor: torch.Tensor, slot: int) -> torch.cuda.Event | None:
        """Begin the copy; an event to wait on (None: already done, synchronously)."""
        target = self.slab[slot * self.nbytes : (slot + 1) * self.nbytes]
        if self.mode == "pageable":
            target.copy_(tensor.cpu())
            return None
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream())
        self.side.wait_event(ready)
        with torch.cuda.stream(self.side):
            tensor.record_stream(self.side)
            if self.ring is not None:
                staged = self.ring[slot * self.nbytes : (slot + 1) * self.nbytes]
                staged.copy_(tensor, non_blocking=True)
            else:
                target.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side)
        return done

    def finish(self, slot: int) -> None:
        """After the copy's event: the host part (pinned ring -> slab)."""
        if self.ring is not None:
            a, b = slot * self.nbytes, (slot + 1) * self.nbytes
            self.slab[a:b].copy_(self.ring[a:b])

    def close(self) -> None:
        del self.slab
        unregister(self.address)


def hop_latency(mode: str, nbytes: int) -> dict[str, Any]:
    shm = shared_memory.SharedMemory(create=True, size=SLOTS * nbytes)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=receiver, args=(shm.name, nbytes, mode == "registered_shm", there))
    child.start()
    producer = None
    try:
        tag, pinned = here.recv()
        assert tag == "ready"
        producer = Producer(mode, shm, nbytes)
        latencies, exact = [], True
        for i in range(HOPS):
            tensor = payload(i, nbytes, "cuda")
            torch.cuda.synchronize()
            slot = i % SLOTS
            started = time.perf_counter()
            event = producer.start(tensor, slot)
            if event is not None:
                event.synchronize()
            producer.finish(slot)
            here.send((slot, i))
            done, ok = here.recv()
            exact &= ok
            if i >= 10:
                latencies.append((done - started) * 1e3)
        here.send(None)
        child.join(30)
        return {
            "hop_ms_p50": round(statistics.median(latencies), 4),
            "hop_ms_p99": round(sorted(latencies)[int(0.99 * len(latencies))], 4),
            "exact": exact,
            "receiver_pinned": pinned,
        }
    finally:
        if producer is not None:
            producer.close()
        if child.is_alive():
            child.kill()
        with contextlib.suppress(BufferError):
            shm.close()
        shm.unlink()


def step_cost(mode: str, nbytes: int) -> dict[str, Any]:
    """A loop of ~3 ms forward steps; each hands its output off (a waiter thread waits)."""
    width = 4096
    weight = torch.randn(width, width, device="cuda", dtype=torch.bfloat16)
    hidden = torch.randn(2048, width, device="cuda", dtype=torch.bfloat16)  # 16 MiB
    shm = shared_memory.SharedMemory(create=True, size=SLOTS * nbytes)
    producer = Producer(mode, shm, nbytes) if mode != "none" else None
    free = threading.Semaphore(SLOTS)
    pending: list[tuple[torch.cuda.Event, int]] = []
    wake = threading.Condition()

    def waiter() -> None:
        while True:
            with wake:
                while not pending:
                    wake.wait()
                event, slot = pending.pop(0)
            if slot < 0:
                return
            event.synchronize()
            assert producer is not None
            producer.finish(slot)
            free.release()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    times = []
    try:
        compute = torch.cuda.current_stream()
        for step in range(STEPS):
            compute.synchronize()  # the compute stream only: a copy may still run
            started = time.perf_counter()
            for _ in range(12):
                hidden = torch.tanh(hidden @ weight)
            out = hidden.view(-1).view(torch.uint8)[:nbytes].clone()
            if producer is not None:
                free.acquire()
                slot = step % SLOTS
                event = producer.start(out, slot)
                if event is None:
                    free.release()
                else:
                    with wake:
                        pending.append((event, slot))
                        wake.notify()
            compute.synchronize()
            if step >= 20:
                times.append((time.perf_counter() - started) * 1e3)
    finally:
        with wake:
            pending.append((torch.cuda.Event(), -1))
            wake.notify()
        thread.join(10)
        torch.cuda.synchronize()
        if producer is not None:
            producer.close()
        with contextlib.suppress(BufferError):
            shm.close()
        shm.unlink()
    return {"step_ms_p50": round(statistics.median(times), 4)}


def main() -> None:
    out = sys.argv[1]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "sizes": {},
    }
    for label, nbytes in SIZES.items():
        entry: dict[str, Any] = {"hop": {}, "step": {}}
        for mode in ("pageable", "pinned_ring", "registered_shm"):
            entry["hop"][mode] = hop_latency(mode, nbytes)
        for mode in ("none", "pageable", "pinned_ring", "registered_shm"):
            entry["step"][mode] = step_cost(mode, nbytes)
        base = entry["step"]["none"]["step_ms_p50"]
        entry["step_overhead_pct"] = {
            mode: round(100 * (entry["step"][mode]["step_ms_p50"] / base - 1), 2)
            for mode in ("pageable", "pinned_ring", "registered_shm")
        }
        report["sizes"][label] = entry
        print(label, json.dumps(entry), flush=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
