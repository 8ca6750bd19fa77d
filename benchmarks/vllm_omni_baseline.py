"""Baseline for ``omni-actors bench transport``: a connector shaped like vllm-omni's.

Per message: pickle the payload dict, write it into a *fresh* shared-memory segment,
send the segment's name and size over a pipe; the reader attaches, unpickles (a copy
out), closes and unlinks the segment, and acks over a pipe. This file lives outside the
package on purpose: omni-actors itself never uses pickle.

Usage: python benchmarks/vllm_omni_baseline.py SIZE_BYTES ITERATIONS WARMUP
Prints one JSON object: {"us": [per-iteration round-trip microseconds]}.

Segments are named ``bench-baseline-<pid of the bench>-<writer pid>-<seq>`` (vllm-omni's
use random names) so the bench's tests can tell that nothing of theirs was left behind.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import torch


def _unlink(name: str) -> None:
    """Remove a segment the reader never got to (it died or the writer was interrupted)."""
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    shm.close()
    shm.unlink()  # also drops the tracker registration that attaching made


def reader() -> None:
    """Attach each announced segment, unpickle it (a copy out), unlink it, ack."""
    for line in sys.stdin:
        name, size = line.split()
        shm = shared_memory.SharedMemory(name=name)
        assert shm.buf is not None
        payload = pickle.loads(shm.buf[: int(size)])
        assert payload["data"].numel() >= 0
        del payload
        shm.close()
        shm.unlink()  # also drops the tracker registration that attaching made
        sys.stdout.write("k\n")
        sys.stdout.flush()


def writer(size: int, iterations: int, warmup: int) -> None:
    """Time ``warmup + iterations`` round trips against a reader subprocess."""
    peer = subprocess.Popen(
        [sys.executable, __file__, "--reader"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert peer.stdin is not None
    assert peer.stdout is not None
    data = torch.from_numpy(np.random.default_rng(1).random(size // 4, dtype=np.float32))
    samples = []
    prefix = f"bench-baseline-{os.getppid()}-{os.getpid()}-"
    pending: str | None = None  # a segment sent but not yet acked (so not yet unlinked)
    try:
        for i in range(warmup + iterations):
            start = time.perf_counter()
            blob = pickle.dumps({"seq": i, "data": data}, protocol=pickle.HIGHEST_PROTOCOL)
            shm = shared_memory.SharedMemory(name=f"{prefix}{i}", create=True, size=len(blob))
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
            assert shm.buf is not None
            shm.buf[: len(blob)] = blob
            pending = shm.name
            shm.close()
            peer.stdin.write(f"{pending} {len(blob)}\n")
            peer.stdin.flush()
            if not peer.stdout.readline():
                raise RuntimeError("baseline reader exited before acking")
            pending = None
            if i >= warmup:
                samples.append((time.perf_counter() - start) * 1e6)
    finally:
        peer.stdin.close()
        try:
            peer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            peer.kill()
            peer.wait()
        peer.stdout.close()
        if pending is not None:
            _unlink(pending)
    print(json.dumps({"us": samples}))


if __name__ == "__main__":
    if sys.argv[1:] == ["--reader"]:
        reader()
    else:
        writer(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
