"""``bench load``: how long each stage of a Qwen3-Omni release takes to load, and what
memory it takes, on the device it serves from.

Each stage is loaded as its engine loads it (``weights.load``: built on its device,
filled from its own shards only) and kept, so stages that share a GPU add up there as
they do when serving. For each: the seconds, the stage's weights by the shard headers,
the shards it opened, the peak GPU memory on its device, and the host's resident memory
before and at its peak while loading, sampled every few milliseconds on a thread of its
own (``/proc/self/statm``): loading must never hold the stage on the host.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["host_rss", "run_load_bench"]

_GIB = 2**30
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def host_rss() -> tuple[int, int]:
    """This process's resident bytes now: all of them, and those not backed by a file
    (the shards' pages mapped while a stage loads are resident but the kernel's to drop)."""
    with open("/proc/self/statm") as statm:
        fields = statm.read().split()
    resident, shared = int(fields[1]) * _PAGE, int(fields[2]) * _PAGE
    return resident, resident - shared


@contextmanager
def _peak_rss(every_s: float = 0.005) -> Iterator[list[int]]:
    """Sample the resident memory while the block runs; yields ``[peak, peak not backed
    by a file]``, final after it."""
    peak = list(host_rss())
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every_s):
            peak[:] = map(max, peak, host_rss())

    sampler = threading.Thread(target=sample, name="rss sampler", daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        peak[:] = map(max, peak, host_rss())


def run_load_bench(model: Path, devices: Mapping[str, str]) -> dict[str, Any]:
    """Load each stage of the release in ``model`` onto its device (``devices``: stage
    -> device, in loading order) and report what each took (module docstring)."""
    import torch

    from omni_actors.actors.engines.qwen3_omni import weights
    from omni_actors.models.release import Release

    report: dict[str, Any] = {"model": str(model), "stages": {}}
    kept: list[Any] = []
    for stage, name in devices.items():
        device = torch.device(name)
        release = Release.open(model)
        on_gpu = device.type == "cuda"
        if on_gpu:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            gpu_before = torch.cuda.memory_allocated(device)
        before, anon_before = host_rss()
        start = time.perf_counter()
        with _peak_rss() as peak:
            kept.append(weights.load(model, stage, device=device, release=release))
            if on_gpu:
                torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        stage_bytes = release.tensor_bytes(f"{stage}.")
        entry: dict[str, Any] = {
            "device": str(device),
            "seconds": round(seconds, 2),
            "weights_gib": round(stage_bytes / _GIB, 3),
            "shards_opened": [p.name for p in release.opened],
            "host_rss_before_gib": round(before / _GIB, 3),
            "host_rss_peak_gib": round(peak[0] / _GIB, 3),
            "host_anon_peak_gib": round(peak[1] / _GIB, 3),
            "host_peak_over_weights": round((peak[0] - before) / max(stage_bytes, 1), 3),
            "host_anon_peak_over_weights": round((peak[1] - anon_before) / max(stage_bytes, 1), 3),
        }
        if on_gpu:
            entry["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated(device) / _GIB, 3)
            entry["gpu_added_gib"] = round(
                (torch.cuda.memory_allocated(device) - gpu_before) / _GIB, 3
            )
        report["stages"][stage] = entry
    report["machine"] = {
        "torch": torch.__version__,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    return report
