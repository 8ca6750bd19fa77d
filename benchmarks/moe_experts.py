"""The MoE experts forward alone: transformers' (its ``grouped_mm`` implementation) against
the engines' lean one (:mod:`~omni_actors.actors.engines.qwen3_omni.moe`).

For tiny-omni's shape and Qwen3-Omni's thinker and talker widths, random weights and a
softmax-top-k routing of ``--tokens`` tokens: the median time of each forward, their
largest difference, and (on a GPU) whether the lean forward replays from a CUDA graph
with the output of its eager run. One JSON object per line on stdout:

    python3 benchmarks/moe_experts.py --tokens 1 256 2500          # a GPU
    python3 benchmarks/moe_experts.py --compiled inductor          # and compiled
    python3 benchmarks/moe_experts.py --tokens 2500 --profile      # and its kernels
    python3 benchmarks/moe_experts.py --triton-combine             # moe_combine='triton'
    python3 benchmarks/moe_experts.py --triton-fused 64x128x64x4x3 # moe_fused_triton's
    DRY=1 python3 benchmarks/moe_experts.py --tokens 2500          # the CPU
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from thinker_prefill_profile import table  # this directory's, run as a script
from torch.profiler import ProfilerActivity, profile
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeTextConfig,
)

from omni_actors.actors.engines.qwen3_omni import moe_combine
from omni_actors.actors.engines.qwen3_omni.hf import Qwen3OmniMoeThinkerTextExperts
from omni_actors.actors.engines.qwen3_omni.moe import LeanExperts

# name: hidden, intermediate, experts, top-k
SHAPES = {
    "tiny": (64, 64, 4, 2),
    "talker": (1024, 384, 128, 6),
    "thinker": (2048, 768, 128, 8),
}


def out(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def timed(fn: Callable[[], Any], device: torch.device, n: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(n):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 256, 2500])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--compiled", default="", help="also time the lean forward compiled by this backend"
    )
    parser.add_argument(
        "--triton-combine",
        action="store_true",
        help="also time the lean forward ending in moe_combine's Triton kernel (a GPU)",
    )
    parser.add_argument(
        "--triton-fused",
        nargs="*",
        metavar="MxNxKxWARPSxSTAGES",
        help="also time moe_fused_triton's kernels with each block config (a GPU; none "
        "given: 64x128x64x4x3)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also list the device kernels of the lean forward (from its graph on a GPU)",
    )
    ns = parser.parse_args()
    device = torch.device("cpu" if os.environ.get("DRY") == "1" else "cuda:0")
    dtype = getattr(torch, ns.dtype)
    out(what="config", device=str(device), torch=torch.__version__, dtype=ns.dtype)
    generator = torch.Generator(device).manual_seed(0)
    for name in ns.shapes:
        hidden_size, intermediate, experts, top_k = SHAPES[name]
        config = Qwen3OmniMoeTextConfig(
            hidden_size=hidden_size,
            moe_intermediate_size=intermediate,
            num_experts=experts,
            num_experts_per_tok=top_k,
        )
        config._experts_implementation = "grouped_mm"
        with torch.device(device):
            theirs = Qwen3OmniMoeThinkerTextExperts(config)
        with torch.no_grad():
            for param in (theirs.gate_up_proj, theirs.down_proj):
                param.normal_(0.0, 0.02, generator=generator)
        theirs = theirs.to(dtype).requires_grad_(False)
        lean = LeanExperts(theirs)
        for tokens in ns.tokens:
            hidden = torch.randn(tokens, hidden_size, device=device, generator=generator)
            logits = torch.randn(tokens, experts, device=device, generator=generator)
            weights, index = torch.softmax(logits, -1).topk(top_k, -1)
            hidden, weights = hidden.to(dtype), (weights / weights.sum(-1, keepdim=True)).to(dtype)
            with torch.no_grad():
                ours_out = lean(hidden, index, weights)
                diff = (ours_out.float() - theirs(hidden, index, weights).float()).abs().max()
                row: dict[str, Any] = {
                    "what": "experts",
                    "shape": name,
                    "tokens": tokens,
                    "transformers_ms": timed(
                        functools.partial(theirs, hidden, index, weights), device, ns.repeat
                    ),
                    "lean_ms": timed(
                        functools.partial(lean, hidden, index, weights), device, ns.repeat
                    ),
                    "max_abs_diff": float(diff),
                }
                if ns.compiled:
                    # As the engines' compiled layers run it.
                    compiled = torch.compile(lean, backend=ns.compiled, fullgraph=True)
                    traced = compiled(hidden, index, weights)
                    row["compiled_ms"] = timed(
                        functools.partial(compiled, hidden, index, weights), device, ns.repeat
                    )
                    row["compiled_max_abs_diff"] = float((traced - ours_out).abs().max())
                if device.type == "cuda":
                    graph, captured = capture(functools.partial(lean, hidden, index, weights))
                    row["graph_equal"] = bool(torch.equal(captured, ours_out))
                    row["graph_ms"] = timed(graph.replay, device, ns.repeat)
                if ns.profile:
                    run = functools.partial(lean, hidden, index, weights)
                    if device.type == "cuda":
                        run = graph.replay
                    row["top"] = kernels(run, device, ns.repeat)
                    if ns.compiled:
                        row["compiled_top"] = kernels(
                            functools.partial(compiled, hidden, index, weights), device, ns.repeat
                        )
                if ns.triton_fused is not None:
                    for config in ns.triton_fused or ["64x128x64x4x3"]:
                        try:
                            row.update(
                                triton_fused(theirs, hidden, index, weights, ours_out, config, ns)
                            )
                        except Exception as exc:  # a kernel that fails is a result here
                            row[f"fused_{config}_error"] = repr(exc)[:400]
                if ns.triton_combine:
                    try:
                        row.update(triton_combined(lean, hidden, index, weights, ours_out, ns))
                    except Exception as exc:  # a kernel that fails is a result here
                        row["triton_error"] = repr(exc)[:400]
            out(**row)


def capture(fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``fn`` captured in a CUDA graph (after a warm-up off the capture), replayed once."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        captured = fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, captured


def triton_fused(
    experts: Qwen3OmniMoeThinkerTextExperts,
    hidden: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    reference: torch.Tensor,
    config: str,
    ns: argparse.Namespace,
) -> dict[str, Any]:
    """``moe_fused_triton.fused_experts`` with block config ``config``: eager, from a graph,
    its largest difference from the lean forward's ``reference``, and (``--profile``) the
    graph's kernels, each key prefixed ``fused_<config>_``."""
    from moe_fused_triton import fused_experts  # this directory's; needs triton

    block_m, block_n, block_k, warps, stages = (int(part) for part in config.split("x"))
    run = functools.partial(
        fused_experts,
        experts.gate_up_proj,
        experts.down_proj,
        hidden,
        index,
        weights,
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        num_warps=warps,
        num_stages=stages,
    )
    device = hidden.device
    result = run()
    key = f"fused_{config}_"
    row: dict[str, Any] = {
        key + "ms": timed(run, device, ns.repeat),
        key + "max_abs_diff": float((result.float() - reference.float()).abs().max()),
    }
    if device.type == "cuda":
        graph, captured = capture(run)
        row[key + "graph_equal"] = bool(torch.equal(captured, result))
        row[key + "graph_ms"] = timed(graph.replay, device, ns.repeat)
        if ns.profile:
            row[key + "top"] = kernels(graph.replay, device, ns.repeat)
    return row


def triton_combined(
    lean: LeanExperts,
    hidden: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    reference: torch.Tensor,
    ns: argparse.Namespace,
) -> dict[str, Any]:
    """The lean forward with ``moe_combine="triton"`` (its Triton kernel from 64 tokens
    on): eager, from a graph, compiled (``--compiled``), its largest difference from
    ``reference``, and (``--profile``) the graph's kernels."""
    device = hidden.device
    run = functools.partial(lean, hidden, index, weights)
    lean.combine = "triton"
    try:
        combined = run()
        row: dict[str, Any] = {
            "triton_serves": moe_combine.serves(combined, hidden.shape[0]),
            "triton_ms": timed(run, device, ns.repeat),
            "triton_max_abs_diff": float((combined.float() - reference.float()).abs().max()),
        }
        graph, captured = capture(run)
        row["triton_graph_equal"] = bool(torch.equal(captured, combined))
        row["triton_graph_ms"] = timed(graph.replay, device, ns.repeat)
        if ns.compiled:
            compiled = torch.compile(lean, backend=ns.compiled, fullgraph=True)
            traced = compiled(hidden, index, weights)
            row["triton_compiled_ms"] = timed(
                functools.partial(compiled, hidden, index, weights), device, ns.repeat
            )
            row["triton_compiled_max_abs_diff"] = float((traced - combined).abs().max())
        if ns.profile:
            row["triton_top"] = kernels(graph.replay, device, ns.repeat)
    finally:
        lean.combine = "gather"
    return row


def kernels(fn: Callable[[], Any], device: torch.device, n: int) -> list[dict[str, Any]]:
    """The top kernels (ops on the CPU) of ``n`` calls of ``fn``, by time per call."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    fn()
    with profile(activities=activities) as prof:
        for _ in range(n):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return [
        {**row, "calls": row["calls"] / n, "self_ms": round(row["self_ms"] / n, 4)}
        for row in table(prof, device)
    ]


if __name__ == "__main__":
    main()
