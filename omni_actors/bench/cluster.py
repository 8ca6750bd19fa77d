"""What a cross-node hop costs: a pipeline's stages on a Ray cluster against the same
stages in worker processes on this machine (``bench pipeline --cluster``).

Both pipelines run at once in this process, with the same weights and replies of the
same length; their requests alternate one by one (concurrency 1), so a slow phase of
the machine hits both alike. The stages of the first link over IPC; those of the second
over TCP with CURVE, through Ray's placement (``--cluster local-ray``: two Ray nodes on
this machine, the entry stage on node A and the others on node B, so every hop crosses
nodes, over loopback). The difference of their TTFA p50, divided by the hops on the
path to the first audio, is what one cross-node hop adds.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omni_actors.bench.models import _level, fixed_replies
from omni_actors.bench.pipeline import _drive, _machine, _request
from omni_actors.cluster.local_ray import LOCAL_RAY, start_local_ray
from omni_actors.models.cache import prepare
from omni_actors.pipeline.cluster_hosts import pin
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline

__all__ = ["HOP_LIMIT_MS", "run_cluster_bench"]

HOP_LIMIT_MS = 2.0
"""Target: what a cross-node hop may add to TTFA (p50, loopback TCP against IPC)."""

_WARMUP = 2
_REQUESTS = 20


@contextlib.contextmanager
def _cluster(cluster: str, spec: PipelineSpec) -> Iterator[PipelineSpec]:
    """``spec`` placed on ``cluster``; a local one is started and stopped around it."""
    if cluster != LOCAL_RAY:
        yield spec.on_cluster(cluster)
        return
    local = start_local_ray()
    try:
        yield pin(spec, local.address)
    finally:
        local.shutdown()


async def run_cluster_bench(
    preset: str | Path,
    cluster: str,
    requests: int | None = None,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    reply_tokens: int = 48,
) -> dict[str, Any]:
    """TTFA with ``preset``'s stages on ``cluster`` against them in local workers.

    Args:
        preset: a preset name or YAML path.
        cluster: ``local-ray``, or a Ray address (then the preset's own placements
            say where its stages go).
        requests: measured requests per placement (default 20), after a warm-up.
        cache_dir: the weights cache of a model preset (prepared first if missing).
        seed: the weights' seed.
        reply_tokens: every reply of a model preset is exactly this many text tokens.

    Returns:
        ``placements`` (``process`` and ``cluster``: TTFA p50/p99, RTF p50, E2E p50,
        errors), ``hops`` on the path to the first audio, ``cross_node_ms_per_hop_p50``,
        ``targets``, ``machine``, ``parameters`` and ``wall_s``.

    Raises:
        PipelineConfigError: a Ray address with a preset that places no stage.
        ValueError: ``requests`` below 1.
        ImportError: Ray is not installed.
    """
    count = _REQUESTS if requests is None else requests
    if count < 1:
        raise ValueError(f"requests must be >= 1, got {count}")
    started = time.perf_counter()
    spec = load_pipeline(preset)
    for family in spec.model_families().values():
        prepare(family, cache_dir=cache_dir, seed=seed)
    if spec.model_families():
        spec = fixed_replies(spec.with_weights(cache_dir=cache_dir, seed=seed), reply_tokens)
    local = spec.off_cluster().with_process_stages(True)
    results: dict[str, list[Any]] = {"process": [], "cluster": []}
    with _cluster(cluster, spec) as placed:
        async with (
            OmniPipeline(local, max_sessions=1) as near,
            OmniPipeline(placed, max_sessions=1) as far,
        ):
            pipelines = {"process": near, "cluster": far}
            for omni in pipelines.values():
                await _drive(omni, _WARMUP, 1)
            gc.collect()
            for _ in range(count):
                for label, omni in pipelines.items():
                    results[label].append(await _request(omni))
    levels = {label: _level(samples) for label, samples in results.items()}
    hops = len(spec.stages_for(text=True, audio=spec.outputs.audio is not None)) + 1
    near_p50 = levels["process"].get("ttfa_ms_p50")
    far_p50 = levels["cluster"].get("ttfa_ms_p50")
    per_hop = None
    if near_p50 is not None and far_p50 is not None:
        per_hop = round((far_p50 - near_p50) / hops, 3)
    return {
        "placements": levels,
        "hops": hops,
        "cross_node_ms_per_hop_p50": per_hop,
        "targets": {
            "cross_node_ms_per_hop_p50": {
                "limit": HOP_LIMIT_MS,
                "measured": per_hop,
                "met": None if per_hop is None else per_hop < HOP_LIMIT_MS,
            }
        },
        "machine": _machine(),
        "parameters": {
            "preset": str(preset),
            "cluster": cluster,
            "requests": count,
            "warmup_requests": _WARMUP,
            "concurrency": 1,
            "reply_tokens": reply_tokens if spec.model_families() else None,
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
