"""Hop latency of each path a tensor can take from one GPU stage to another process.

A hop runs from the tensor being ready on the sender's GPU to it being on the
receiver's GPU (the receiver waits for its copies, then replies; the reply is part of
every path's time alike). Paths:

- ``host``: device -> page-locked slot on the sender's copy stream -> the transport
  (a ZeroMQ frame, or the shared-memory slab from 1 MiB) -> page-locked slot -> device;
- ``ipc``: a device link on the same GPU: one device-to-device copy into a slot of the
  sender's pool, one out of it in the receiver, no host memory;
- ``peer``: the same link to a receiver on another GPU (needs two GPUs).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from omni_actors import ActorSystem, Props
from omni_actors.bench.link_sink import HopSink, HostHop, LinkHop, SlotReturns
from omni_actors.bench.rows import row
from omni_actors.bench.stats import percentile
from omni_actors.cuda import HostStaging
from omni_actors.cuda.ipc import DeviceLink
from omni_actors.protocols.device import DeviceLinkAnswer

__all__ = ["HOP_SIZES", "measure_hops"]

HOP_SIZES = {"1MiB": 1 << 20, "16MiB": 16 << 20}
_ASK_S = 30.0


async def measure_hops(hops: int = 100, warmup: int = 10) -> dict[str, Any]:
    """``hop_ms_p50``/``p90`` per path and size; needs CUDA (else a ``skipped`` reason).

    A path that fails is reported as its ``{"error": ...}``; the other paths still run.
    """
    if not torch.cuda.is_available():
        return {"skipped": "needs CUDA"}
    sender = torch.device("cuda", 0)
    targets = {"host": sender, "ipc": sender}
    if torch.cuda.device_count() > 1:
        targets["peer"] = torch.device("cuda", 1)
    result: dict[str, Any] = {}
    async with ActorSystem("bench-cuda-hops") as system:
        for path, device in targets.items():
            # A path that fails (its sink's worker dying included) is its row's error.
            work = _sink_path(system, path, sender, device, hops, warmup)
            result[path] = await row(f"bench cuda: hop path {path}", work)
    if "peer" not in result:
        result["peer"] = {"skipped": "one GPU: a two-GPU machine measures the peer path"}
    return result


async def _sink_path(
    system: ActorSystem,
    path: str,
    sender: torch.device,
    receiver: torch.device,
    hops: int,
    warmup: int,
) -> dict[str, Any]:
    sink = await system.spawn(HopSink, str(receiver), name=f"hop-{path}", props=Props(process=True))
    try:
        return await _path(system, sink, path, sender, hops, warmup)
    finally:
        await system.stop(sink)


async def _path(
    system: ActorSystem, sink: Any, path: str, device: torch.device, hops: int, warmup: int
) -> dict[str, Any]:
    largest = max(HOP_SIZES.values())
    staging = HostStaging(device, slots=4, slot_bytes=largest)
    link = DeviceLink(device, slots=4, slot_bytes=largest) if path != "host" else None
    out: dict[str, Any] = {}
    returns = None
    try:
        if link is not None:
            returns = await system.spawn(SlotReturns, link.release, name=f"slots-{path}")
            answer = await sink.ask(link.offer("bench", returns), timeout=_ASK_S)
            assert isinstance(answer, DeviceLinkAnswer)
            if not answer.accepted:
                return {"refused": answer.reason}
            out["peer_copy"] = answer.peer
        for label, size in HOP_SIZES.items():
            data = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
            samples = []
            for i in range(warmup + hops):
                data.add_(1)  # new content each hop, made on the compute stream
                torch.cuda.current_stream(device).synchronize()
                start = time.perf_counter()
                if link is None:
                    host = await staging.to_host({"x": data})
                    await sink.ask(HostHop(host), timeout=_ASK_S)
                else:
                    slices, _ = link.put({"x": data})
                    if not slices:
                        raise RuntimeError("the device link had no free slot")
                    await sink.ask(LinkHop(slices), timeout=_ASK_S)
                if i >= warmup:
                    samples.append((time.perf_counter() - start) * 1e3)
            out[label] = {
                "hop_ms_p50": round(percentile(samples, 50), 4),
                "hop_ms_p90": round(percentile(samples, 90), 4),
            }
    finally:
        await staging.close()
        if link is not None:
            link.close()
        if returns is not None:
            await system.stop(returns)
    return out
