"""Engine compute of a scripted pipeline: what its engines cost with no framework around.

``bench pipeline`` reports the framework's CPU per chunk-hop as the process tree's CPU
time minus the engines' own compute. A scripted engine computes nothing, but stepping it
still costs Python: a loop timer and a future per output, its async generator, the
output's fields. That cost is the engine's, not the framework's, and it is paid in
whichever process runs the stage, so it is measured apart: the same engines, chained
directly (each one's outputs, narrowed to the edge's fields, are the next one's inputs),
run as many requests at the same concurrency on this loop, and the CPU time per request
is what the bench subtracts for each request it measured.

The chain takes no windows, sequences, credits or messages, so what it costs is an upper
bound of what the engines cost inside the pipeline: a code2wav stage fed a window of 25
frames steps once per frame either way, but takes one input item instead of 25.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import torch

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.scripted import ScriptedArgs, ScriptedEngine, ScriptedEngineError
from omni_actors.pipeline.spec.pipeline import PipelineSpec

__all__ = ["engine_cpu_ms_per_request"]


async def engine_cpu_ms_per_request(
    spec: PipelineSpec, concurrency: int, requests: int
) -> float | None:
    """CPU milliseconds per request that ``spec``'s engines take by themselves, with
    ``concurrency`` of ``requests`` requests in flight (see the module docstring).

    None when it cannot be measured this way: a stage on the path of a text-and-audio
    request is not scripted, one takes more than one upstream stage, or an engine is
    declared to fail (``fail_after``) within a request.
    """
    chain = _chain(spec)
    if chain is None:
        return None
    engines = [(ScriptedEngine(args), fields) for args, fields in chain]
    tickets = itertools.count()
    failed: list[ScriptedEngineError] = []

    async def worker() -> None:
        while not failed and (n := next(tickets)) < requests:
            await _request(engines, f"engine-cpu-{n}", failed)

    # As the pipeline's engines are by its warm-up: outputs made once, code paths run.
    await _request(engines, "engine-cpu-warm-up", failed)
    started = time.process_time()
    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, requests)):
            group.create_task(worker())
    if failed:
        return None
    return (time.process_time() - started) / requests * 1e3


def _chain(spec: PipelineSpec) -> list[tuple[ScriptedArgs, tuple[str, ...] | None]] | None:
    """Each stage on the request's path, in order, with the fields its input edge
    carries (None for the entry stage); None if the path is not a chain of scripted
    stages."""
    order = spec.stages_for(text=True, audio=True)
    chain: list[tuple[ScriptedArgs, tuple[str, ...] | None]] = []
    for name in order:
        engine = spec.stage(name).engine
        if engine.kind != "scripted":
            return None
        upstream = [edge.source for edge in spec.edges if edge.to == name and edge.source in order]
        if name == spec.entry_stage:
            fields = None
        elif len(upstream) == 1 and chain and order[len(chain) - 1] == upstream[0]:
            fields = tuple(spec.edge_fields(upstream[0], name))
        else:
            return None
        chain.append((ScriptedArgs.model_validate(engine.args), fields))
    return chain


async def _request(
    engines: list[tuple[ScriptedEngine, tuple[str, ...] | None]],
    session: str,
    failed: list[ScriptedEngineError],
) -> None:
    """One text request through the chained engines, read to its end (an engine's
    declared failure is added to ``failed``)."""
    stream: AsyncIterator[Fields] = _text()
    for engine, fields in engines:
        if fields is not None:
            stream = _narrowed(stream, fields)
        stream = engine.generate(session, stream)
    try:
        async for _ in stream:
            pass
    except ScriptedEngineError as exc:
        failed.append(exc)
    finally:
        for engine, _ in engines:
            await engine.release(session)


async def _text() -> AsyncIterator[Fields]:
    yield {"text": "hello"}


async def _narrowed(
    stream: AsyncIterator[Fields], fields: tuple[str, ...]
) -> AsyncIterator[Fields]:
    """``stream``'s items with only ``fields`` (what the edge carries)."""
    async for item in stream:
        narrowed: dict[str, torch.Tensor | str] = {k: v for k, v in item.items() if k in fields}
        yield narrowed
