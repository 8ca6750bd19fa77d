"""``bench decode``: the thinker's decode step and the talker's frame per batch size,
through each stage's step loop, eager against replayed from CUDA graphs, on a release's
real classes.

Each stage loads from the release ``model`` names onto its device, as its engine loads
it, with a slot cache for the largest batch asked. For each batch size it opens that
many sessions on a step loop, each prefilled to ``context`` positions (random prompt ids
for the thinker; random thinker rows for the talker's user part), then times ``steps``
decode-only steps run eagerly over the slot cache and ``steps`` replayed from the
step's CUDA graph (on a GPU; without one both run eagerly), after one untimed step that
captures the graph where it was not captured at load. A step's time is the wall time of
a whole step, picks and read-backs included, with the device synchronised: what a
session waits per token (the thinker's TPOT at that batch) or per codec frame (the
talker, code predictor included; real time needs one frame per 80 ms).

The thinker's decode layers are compiled as its engine compiles them (on a GPU), or not
(``thinker_compile``). The talker's static frame step is compiled as its engine compiles
it (``compile`` ``default``: on a GPU), or as ``compile`` says (``off``, ``layers``, ``predictor``,
``all``: both, the code predictor's projections fused, as the engine compiles it;
``apart``: ``all`` with those projections apart;
:mod:`~omni_actors.actors.engines.qwen3_omni.frame_compile`); ``load_s`` is the
time to build the stage, which with ``warm`` includes capturing (and compiling) every
graph at load, as the engine does.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import torch

__all__ = ["COMPILE_CHOICES", "run_decode_bench"]

COMPILE_CHOICES: Final = ("default", "off", "layers", "predictor", "all", "apart")
"""What of the talker's static frame step to compile (module docstring)."""


def _thinker(
    model: Path,
    device: torch.device,
    batches: Sequence[int],
    context: int,
    steps: int,
    plan: Any,
    compile_layers: Any,
    decode_attention: str = "triton",
) -> dict[str, Any]:
    import asyncio

    from omni_actors.actors.engines.qwen3_omni.sampling import Sampling
    from omni_actors.actors.engines.qwen3_omni.thinker_model import (
        Fed,
        Feeding,
        Pick,
        ThinkerChunk,
        ThinkerModel,
    )
    from omni_actors.actors.engines.step_loop import StepLoop

    thinker = ThinkerModel(
        model,
        device,
        slots=plan.slots,
        max_context=plan.max_len,
        graphs=plan.graphs,
        # Always warm: a graph captured lazily is checked on the step's own rows, and a
        # full-size thinker's batched step replays a few bits off eager (cuBLAS picks its
        # kernels per capture), so it would time eager; the engine warms at load too.
        warm=plan.graphs,
        compile_layers=compile_layers,
        decode_attention=decode_attention,  # type: ignore[arg-type]
    )
    vocab = int(thinker.text_config.vocab_size)
    greedy = Pick(True, Sampling(1 << 30, 0, 0.0, None))
    generator = torch.Generator().manual_seed(0)
    eager = [False]

    async def execute(chunks: list[ThinkerChunk]) -> list[Fed]:
        return thinker.step(chunks, eager=eager[0])

    async def measure(batch: int) -> dict[str, float]:
        loop: StepLoop[Feeding, Fed] = StepLoop(
            execute,
            slots=plan.slots,
            max_context=plan.max_len,
            max_tokens_per_step=max(context, 1),
            max_chunk=max(context, 1),
            name="bench decode",
        )
        loop.start()
        requests = [loop.open(f"s{i}") for i in range(batch)]
        for request in requests:
            ids = torch.randint(0, vocab, (context,), generator=generator, device="cpu")
            await loop.submit(request, Feeding(ids.tolist()), context)
        tokens = [0] * batch
        starts = [request.computed for request in requests]

        async def step() -> None:
            futures = [
                loop.submit(r, Feeding([t], pick=greedy), 1, decode=True)
                for r, t in zip(requests, tokens, strict=True)
            ]
            for index, future in enumerate(futures):
                (fed,) = await future
                assert fed.token is not None
                tokens[index] = fed.token[0]

        eager_ms = await _timed_async(step, device, steps, eager, True, requests, starts)
        await step()  # the graph of this shape (captured at load unless warm failed)
        static_ms = await _timed_async(step, device, steps, eager, False, requests, starts)
        await loop.stop()
        return {"eager_ms": eager_ms, "static_ms": static_ms}

    async def run_all() -> dict[str, Any]:
        return {str(batch): await measure(batch) for batch in batches}

    # As an engine's model thread computes once loaded: on its device by default.
    with torch.device(device):
        rows = asyncio.run(run_all())
    graphs = thinker._graphs
    return {
        "compiled": thinker.compiled,
        "decode_attention": decode_attention,
        "in_place": thinker.cache.in_place,
        "batches": rows,
        "graphed": [list(key) for key in thinker.graphed],
        "capture_s": {}
        if graphs is None
        else {f"{b}x{s}": round(t, 3) for (b, s), t in graphs.capture_s.items()},
        "slot_cache_gib": round(thinker.cache.nbytes / 2**30, 3),
    }


async def _timed_async(
    step: Callable[[], Any],
    device: torch.device,
    steps: int,
    eager: list[bool],
    eager_steps: bool,
    requests: Sequence[Any],
    starts: Sequence[int],
) -> float:
    """Median milliseconds of ``await step()`` over ``steps`` runs, every run decoding
    at the same positions (the slots' lengths are set back after each)."""
    eager[0] = eager_steps
    times = []
    for _ in range(steps):
        for request, start in zip(requests, starts, strict=True):
            request.computed = start
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        await step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 3)


def _frame_compile(choice: str, backend: str, device: torch.device) -> Any:
    from omni_actors.actors.engines.qwen3_omni.frame_compile import (
        FrameCompile,
        FrameCompileArgs,
    )

    if choice == "default":
        return FrameCompileArgs(compile_backend=backend).frame_compile(device)
    if choice == "off":
        return None
    return FrameCompile(
        backend,
        backbone=choice != "predictor",
        predictor=choice != "layers",
        fused=choice != "apart",
    )


def _talker(
    model: Path,
    device: torch.device,
    batches: Sequence[int],
    context: int,
    steps: int,
    plan: Any,
    frame_compile: Any = None,
    decode_attention: str = "triton",
) -> dict[str, Any]:
    import asyncio

    from omni_actors.actors.engines.qwen3_omni.talker_model import (
        Framed,
        TalkerChunk,
        TalkerFeed,
        TalkerModel,
    )
    from omni_actors.actors.engines.step_loop import StepLoop

    started = time.perf_counter()
    talker = TalkerModel(
        model,
        device,
        stop_at_codec_eos=False,
        slots=plan.slots,
        max_context=plan.max_len,
        graphs=plan.graphs,
        warm=plan.warm,
        frame_compile=frame_compile,
        decode_attention=decode_attention,  # type: ignore[arg-type]
    )
    load_s = round(time.perf_counter() - started, 1)
    width = int(talker.talker.config.thinker_hidden_size)
    dtype = next(talker.talker.parameters()).dtype
    speaker = next(iter(talker.speakers.values()))
    generator = torch.Generator().manual_seed(0)
    eager = [False]

    def rows_of(n: int) -> torch.Tensor:
        return torch.randn(n, width, generator=generator, device="cpu").to(device, dtype)

    async def execute(chunks: list[TalkerChunk]) -> list[Framed | None]:
        return talker.step(chunks, eager=eager[0])

    async def measure(batch: int) -> dict[str, float]:
        loop: StepLoop[TalkerFeed, Framed | None] = StepLoop(
            execute,
            slots=plan.slots,
            max_context=plan.max_len,
            max_tokens_per_step=context + 9,
            max_chunk=context + 9,
            name="bench decode",
        )
        loop.start()
        requests = [loop.open(f"s{i}") for i in range(batch)]
        carries = []
        for request in requests:
            mask = torch.zeros(context, dtype=torch.bool, device=device)
            inputs = talker.opening_inputs(
                rows_of(context), mask, rows_of(3), rows_of(3), rows_of(1), speaker
            )
            (*_, first) = await loop.submit(request, TalkerFeed(inputs, frame=True), len(inputs))
            assert first is not None, "an opening makes a frame"
            assert first.frame is not None, "codec EOS is masked"
            carries.append(first.frame[1])
        text = rows_of(1)

        async def step() -> None:
            futures = [
                loop.submit(r, TalkerFeed(carry=c, text=text, frame=True), 1, decode=True)
                for r, c in zip(requests, carries, strict=True)
            ]
            for index, future in enumerate(futures):
                (framed,) = await future
                assert framed is not None, "a frame step makes a frame"
                assert framed.frame is not None, "codec EOS is masked"
                carries[index] = framed.frame[1]

        starts = [request.computed for request in requests]
        eager_ms = await _timed_async(step, device, steps, eager, True, requests, starts)
        await step()  # the graph of this shape (captured at load with warm)
        static_ms = await _timed_async(step, device, steps, eager, False, requests, starts)
        await loop.stop()
        return {"eager_ms": eager_ms, "static_ms": static_ms}

    async def run_all() -> dict[str, Any]:
        return {str(batch): await measure(batch) for batch in batches}

    with torch.device(device):
        rows = asyncio.run(run_all())
    return {
        "load_s": load_s,
        "compiled": talker.compiled,
        "decode_attention": decode_attention,
        "in_place": talker.cache.in_place,
        "batches": rows,
        "graphed": [list(key) for key in talker.graphed],
        "capture_s": {f"{b}x{s}": round(t, 3) for (b, s), t in talker.capture_s.items()},
        "slot_cache_gib": round(talker.cache.nbytes / 2**30, 3),
    }


def run_decode_bench(
    model: Path,
    *,
    stages: dict[str, str],
    batches: Sequence[int],
    context: int,
    steps: int,
    max_context: int,
    talker_compile: str = "default",
    thinker_compile: bool | None = None,
    compile_backend: str = "inductor",
    warm: bool = False,
    fused_min_blocks: int | None = None,
    decode_attention: str = "triton",
) -> dict[str, Any]:
    """Eager and static step times per batch size for each stage in ``stages`` (stage
    name -> device: ``thinker``, ``talker``); the talker's frame step compiled as
    ``talker_compile`` (one of :data:`COMPILE_CHOICES`) says, the thinker's decode
    layers as ``thinker_compile`` says (None: as its engine does, on a GPU), with
    ``compile_backend``; ``warm`` captures every graph when a stage loads;
    ``fused_min_blocks`` replaces :data:`.static_decode.FUSED_MIN_BLOCKS` meanwhile;
    ``decode_attention`` is both stages' (``triton``, the engines' default: in place,
    where it serves, the report's ``in_place`` says whether it did; or ``gather``)."""
    from omni_actors.actors.engines.qwen3_omni import static_decode
    from omni_actors.actors.engines.qwen3_omni.frame_compile import ThinkerCompileArgs
    from omni_actors.actors.engines.qwen3_omni.static_decode import StaticPlan
    from omni_actors.actors.engines.torch_engine import resolve_device

    if fused_min_blocks is not None and fused_min_blocks < 0:
        raise ValueError(f"fused_min_blocks must be >= 0, got {fused_min_blocks}")
    unknown = set(stages) - {"thinker", "talker"}
    if unknown:
        raise ValueError(f"bench decode measures the thinker and the talker, not {sorted(unknown)}")
    if not batches or min(batches) < 1 or context < 1 or steps < 1:
        raise ValueError("batches, context and steps must be positive")
    if context + steps * 2 + 2 >= max_context:
        raise ValueError(f"context {context} leaves no room for {steps} steps in {max_context}")
    if decode_attention not in ("gather", "triton"):
        raise ValueError(f"decode_attention is gather or triton, not {decode_attention!r}")
    if talker_compile not in COMPILE_CHOICES:
        raise ValueError(f"talker_compile is one of {', '.join(COMPILE_CHOICES)}")
    saved = static_decode.FUSED_MIN_BLOCKS
    blocks = saved if fused_min_blocks is None else fused_min_blocks
    report: dict[str, Any] = {"model": str(model), "context": context, "steps": steps}
    report["fused_min_blocks"] = blocks
    static_decode.FUSED_MIN_BLOCKS = blocks
    try:
        for stage, name in stages.items():
            device = resolve_device(name)
            if device.type == "cuda":  # as an engine's model thread does
                torch.cuda.set_device(device)
            with torch.no_grad():
                graphs = device.type == "cuda"
                plan = StaticPlan(max(batches), max_context, graphs=graphs, warm=graphs and warm)
                if stage == "thinker":
                    args = ThinkerCompileArgs(
                        compile_decode=thinker_compile, compile_backend=compile_backend
                    )
                    layers = args.decode_compile(device)
                    measured = _thinker(
                        model, device, batches, context, steps, plan, layers, decode_attention
                    )
                else:
                    compiled = _frame_compile(talker_compile, compile_backend, device)
                    measured = _talker(
                        model, device, batches, context, steps, plan, compiled, decode_attention
                    )
                    measured = {"compile": talker_compile, **measured}
                report[stage] = {"device": str(device), **measured}
            if device.type == "cuda":
                report[stage]["gpu"] = torch.cuda.get_device_name(device)
                torch.cuda.empty_cache()
    finally:
        static_decode.FUSED_MIN_BLOCKS = saved
    return report
