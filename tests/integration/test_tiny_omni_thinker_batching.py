"""The thinker serves every session from one step loop over one slot cache.

Exactness is pinned with the model driven by a step loop directly (a prefill fed in
chunks, sessions joining and leaving while others decode, a rolled-back slot: each
session's tokens are the ones it gets alone, and the one-shot prefill's, which HF's own
forward checks); through the engine, where timing decides the steps, tests assert
structure and the typed refusals.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from graph_standins import Backend, Captures, Differs
from tiny_omni_ids import PRINTABLE_RANGES, Tokens

from omni_actors.actors.engines import torch_engine
from omni_actors.actors.engines.contract import Fields, engine_eager_steps
from omni_actors.actors.engines.qwen3_omni import stepping, thinker_engine
from omni_actors.actors.engines.qwen3_omni.hf import DynamicCache
from omni_actors.actors.engines.qwen3_omni.sampling import Sampling
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.actors.engines.qwen3_omni.thinker_model import (
    ROWS_PIECES,
    Fed,
    Feeding,
    Pick,
    ThinkerChunk,
    ThinkerModel,
)
from omni_actors.actors.engines.step_loop import (
    Chunk,
    ContextLengthError,
    Request,
    SlotsExhaustedError,
    StepLoop,
    Work,
)
from omni_actors.models import cache as model_cache
from omni_actors.testing import eventually

pytestmark = pytest.mark.integration

STEPS = 12
PROMPTS = [list(range(40, 40 + 50)), list(range(60, 60 + 17)), list(range(33, 33 + 90))]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("model-cache")
    model_cache.prepare("tiny-omni", cache_dir=cache)
    return cache


@pytest.fixture(scope="module")
def model(cache_dir: Path) -> ThinkerModel:
    path = cache_dir / "tiny-omni" / "seed-0"
    return ThinkerModel(path, allowed_token_ranges=PRINTABLE_RANGES, slots=4, max_context=256)


def picks() -> list[Pick]:
    """Greedy, sampled with a session generator, greedy: one per session."""
    greedy = Sampling(STEPS, 0, 0.0, None)
    sampled = Sampling(STEPS, 0, 0.9, torch.Generator().manual_seed(7))
    return [Pick(True, greedy), Pick(True, sampled), Pick(True, greedy)]


def loop_over(
    model: ThinkerModel, *, max_chunk: int = 512, budget: int = 512
) -> StepLoop[Feeding, Fed]:
    async def execute(chunks: list[ThinkerChunk]) -> list[Fed]:
        return model.step(chunks)

    return StepLoop(
        execute,
        slots=model.cache.slots,
        max_context=model.cache.max_len,
        max_tokens_per_step=budget,
        max_chunk=max_chunk,
    )


async def session(
    loop: StepLoop[Feeding, Fed], name: str, prompt: list[int], pick: Pick
) -> tuple[list[int], torch.Tensor]:
    """Prefill ``prompt``, then decode ``STEPS`` tokens: the tokens and the prompt's rows."""
    request = loop.open(name)
    fed = await loop.submit(request, Feeding(prompt, rows=True, pick=pick), len(prompt))
    rows = torch.cat([f.rows for f in fed if f.rows is not None])
    assert fed[-1].token is not None
    tokens = [fed[-1].token[0]]
    for _ in range(STEPS):
        (out,) = await loop.submit(request, Feeding([tokens[-1]], pick=pick), 1, decode=True)
        assert out.token is not None
        tokens.append(out.token[0])
    loop.close(request)
    return tokens, rows


async def alone(model: ThinkerModel, **loop_args: Any) -> list[tuple[list[int], torch.Tensor]]:
    results = []
    for i, (prompt, pick) in enumerate(zip(PROMPTS, picks(), strict=True)):
        loop = loop_over(model, **loop_args)
        loop.start()
        results.append(await session(loop, f"s{i}", prompt, pick))
        await loop.stop()
    return results


async def test_a_prefill_fed_in_chunks_computes_the_one_shot_prefill(model: ThinkerModel) -> None:
    whole = await alone(model)
    chunked = await alone(model, max_chunk=7, budget=9)
    for (tokens, rows), (want_tokens, want_rows) in zip(chunked, whole, strict=True):
        assert tokens == want_tokens
        torch.testing.assert_close(rows, want_rows, rtol=1e-4, atol=1e-5)
    # The one-shot prefill is HF's own forward over a DynamicCache.
    cache = DynamicCache(config=model.text_config)
    hf = stepping.thinker_forward(
        model._thinker, torch.tensor([PROMPTS[0]]), cache, 0, accept_layer=model._accept_layer
    )
    torch.testing.assert_close(whole[0][1], hf.embeds[0], rtol=1e-4, atol=1e-5)


async def test_sessions_joining_and_leaving_mid_decode_get_their_tokens_alone(
    model: ThinkerModel,
) -> None:
    """Session 0 decodes; 1 joins with its prefill in chunks mixed into 0's decode
    steps; 2 joins later; each leaves when done: every one's tokens are its own alone."""
    want = [tokens for tokens, _ in await alone(model)]
    decoding = asyncio.Event()

    async def execute(chunks: list[ThinkerChunk]) -> list[Fed]:
        if any(c.work.decode and c.request.id == "s0" for c in chunks):
            decoding.set()  # 1 joins while 0's first decode step runs
        return model.step(chunks)

    loop: StepLoop[Feeding, Fed] = StepLoop(
        execute,
        slots=model.cache.slots,
        max_context=model.cache.max_len,
        max_tokens_per_step=12,
        max_chunk=8,
    )
    loop.start()
    samplers = picks()
    first = asyncio.ensure_future(session(loop, "s0", PROMPTS[0], samplers[0]))
    await asyncio.wait_for(decoding.wait(), timeout=30)
    second = asyncio.ensure_future(session(loop, "s1", PROMPTS[1], samplers[1]))
    got0, _ = await first
    got2, _ = await session(loop, "s2", PROMPTS[2], samplers[2])
    got1, _ = await second
    stats = loop.statistics()
    await loop.stop()
    assert [got0, got1, got2] == want
    assert stats.mixed_steps > 0  # decode rows and prefill chunks shared forwards
    assert stats.free_slots == model.cache.slots


async def test_a_rewound_slot_decodes_again_as_the_first_time(model: ThinkerModel) -> None:
    loop = loop_over(model)
    loop.start()
    request: Request[Feeding, Fed] = loop.open("s")
    greedy = picks()[0]
    await loop.submit(request, Feeding(PROMPTS[0]), len(PROMPTS[0]))
    mark = request.computed

    async def decode() -> list[int]:
        fed = await loop.submit(request, Feeding([PROMPTS[0][-1]], pick=greedy), 1, decode=True)
        tokens = []
        for _ in range(6):
            assert fed[0].token is not None
            tokens.append(fed[0].token[0])
            fed = await loop.submit(request, Feeding([tokens[-1]], pick=greedy), 1, decode=True)
        return tokens

    first = await decode()
    # Something else written over the positions past the mark, then rolled back.
    await loop.submit(request, Feeding(PROMPTS[2][:30]), 30)
    loop.rewind(request, mark)
    again = await decode()
    await loop.stop()
    assert again == first


async def test_the_kv_budget_refuses_sessions_and_positions_that_do_not_fit(
    model: ThinkerModel,
) -> None:
    loop = loop_over(model)
    loop.start()
    held = [loop.open(f"s{i}") for i in range(model.cache.slots)]
    with pytest.raises(SlotsExhaustedError, match="max_sessions"):
        loop.open("one too many")
    with pytest.raises(ContextLengthError, match="max_context"):
        loop.submit(held[0], Feeding([40] * 257), 257)
    loop.close(held[0])
    loop.open("fits now")
    await loop.stop()


async def test_decode_steps_replayed_from_graphs_pick_as_eager(cache_dir: Path) -> None:
    """Decode-only steps through a graph per (row bucket, span), captured at load by a
    stand-in capture: the tokens are eager's, and every shape was captured."""
    path = cache_dir / "tiny-omni" / "seed-0"
    captures = Captures()
    graphed = ThinkerModel(
        path,
        allowed_token_ranges=PRINTABLE_RANGES,
        slots=4,
        max_context=512,
        max_rows=3,
        graphs=True,
        warm=True,
        capture=captures,
    )
    assert (
        graphed.graphed
        == graphed.decode_keys()
        == [(rows, span) for rows in (1, 2, 3) for span in (256, 512)]
    )
    replays = captures.replays
    eager = ThinkerModel(path, allowed_token_ranges=PRINTABLE_RANGES, slots=4, max_context=512)
    prompts = [(p * 6)[:250] for p in PROMPTS]  # decoded past 256: both spans replay

    async def run(model: ThinkerModel) -> list[list[int]]:
        loop = loop_over(model)
        loop.start()
        pick = picks()[0]
        results = []
        for i, prompt in enumerate(prompts):
            results.append(session(loop, f"s{i}", prompt, pick))
        got = await asyncio.gather(*results)
        await loop.stop()
        return [tokens for tokens, _ in got]

    assert await run(graphed) == await run(eager)
    assert captures.replays > replays


@pytest.mark.usefixtures("fresh_compiles")
async def test_decode_steps_with_compiled_layers_pick_as_uncompiled(cache_dir: Path) -> None:
    """Decode steps (and short prefills run as rows) with the decoder layers compiled,
    replayed from graphs, pick the uncompiled model's tokens, sessions joining and
    leaving; every layer runs one shared compiled graph per shape, never one per layer,
    and prefill forwards run their own compiled layers (where asked), not these."""
    path = cache_dir / "tiny-omni" / "seed-0"
    backend, prefills = Backend(), Backend()
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 4}
    compiled = ThinkerModel(
        path,
        **common,
        max_context=256,
        max_rows=3,
        graphs=True,
        capture=Captures(),
        compile_layers=backend,
        compile_prefill=prefills,
    )
    prefill_runs = prefills.runs
    plain = ThinkerModel(path, **common, max_context=256)

    async def run(model: ThinkerModel) -> list[list[int]]:
        loop = loop_over(model)
        loop.start()
        got = await asyncio.gather(
            *(
                session(loop, f"s{i}", p, pick)
                for i, (p, pick) in enumerate(zip(PROMPTS, picks(), strict=True))
            )
        )
        await loop.stop()
        return [tokens for tokens, _ in got]

    assert await run(compiled) == await run(plain)
    assert compiled.compiled == "compiled"
    assert plain.compiled == "off"
    layers = len(compiled._thinker.model.layers)
    assert 1 <= len(backend.graphs) < 2 * layers
    # Only decode steps' shapes: one position per row, never a prompt's length.
    assert not any(str(len(p)) in " ".join(g) for g in backend.graphs for p in PROMPTS)
    assert prefills.runs > prefill_runs  # the prompts' forwards ran the prefill graph


@pytest.mark.usefixtures("fresh_compiles")
async def test_a_decode_compile_that_fails_logs_once_and_runs_uncompiled(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 4}
    failing = ThinkerModel(path, **common, max_context=256, compile_layers=Backend(fail=True))
    plain = ThinkerModel(path, **common, max_context=256)

    async def run(model: ThinkerModel) -> list[int]:
        loop = loop_over(model)
        loop.start()
        tokens, _ = await session(loop, "s", PROMPTS[0], picks()[0])
        await loop.stop()
        return tokens

    with caplog.at_level("WARNING"):
        assert await run(failing) == await run(plain)
    assert failing.compiled.startswith("failed: ")
    assert "no C++ compiler found" in failing.compiled
    warned = [r for r in caplog.records if "thinker layers: torch.compile failed" in r.message]
    assert len(warned) == 1


@pytest.mark.usefixtures("fresh_compiles")
async def test_prefill_forwards_with_compiled_layers_compute_the_uncompiled_ones(
    cache_dir: Path,
) -> None:
    """Prefill forwards through decoder layers compiled at load for any length and any
    segments (chunks starting mid-slot, several sessions' chunks beside decode rows)
    pick the uncompiled model's tokens and rows, and serving compiles nothing more."""
    path = cache_dir / "tiny-omni" / "seed-0"
    backend = Backend()
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 4}
    compiled = ThinkerModel(path, **common, max_context=256, compile_prefill=backend)
    plain = ThinkerModel(path, **common, max_context=256)
    assert compiled.prefill_compiled == "compiled"
    assert (compiled.compiled, plain.prefill_compiled) == ("off", "off")
    at_load = list(backend.graphs)
    assert at_load  # compiled at load, not in a first prompt's time

    async def run(model: ThinkerModel) -> list[tuple[list[int], torch.Tensor]]:
        results = await alone(model, max_chunk=7, budget=9)
        loop = loop_over(model, max_chunk=8, budget=12)
        loop.start()
        together = await asyncio.gather(
            *(
                session(loop, f"s{i}", p, pick)
                for i, (p, pick) in enumerate(zip(PROMPTS, picks(), strict=True))
            )
        )
        stats = loop.statistics()
        await loop.stop()
        assert stats.mixed_steps > 0
        return [*results, *together]

    runs = backend.runs
    got, want = await run(compiled), await run(plain)
    for (tokens, rows), (want_tokens, want_rows) in zip(got, want, strict=True):
        assert tokens == want_tokens
        torch.testing.assert_close(rows, want_rows, rtol=1e-4, atol=1e-5)
    assert backend.runs > runs  # the prefills ran the compiled layers
    assert backend.graphs == at_load


@pytest.mark.usefixtures("fresh_compiles")
async def test_a_prefill_compile_that_fails_logs_once_and_runs_uncompiled(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 4}
    with caplog.at_level("WARNING"):
        failing = ThinkerModel(path, **common, max_context=256, compile_prefill=Backend(fail=True))
        got = await alone(failing, max_chunk=7, budget=9)
    plain = ThinkerModel(path, **common, max_context=256)
    want = await alone(plain, max_chunk=7, budget=9)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
    assert failing.prefill_compiled.startswith("failed: ")
    assert "no C++ compiler found" in failing.prefill_compiled
    warned = [r for r in caplog.records if "thinker prefill: torch.compile failed" in r.message]
    assert len(warned) == 1


def decode_chunks(rows: int) -> list[ThinkerChunk]:
    """A decode-only step of ``rows`` sessions (slots 0 ..), each at position 0."""
    loop = asyncio.get_running_loop()
    pick = Pick(True, Sampling(1, 0, 0.0, None))
    return [
        Chunk(
            Request(f"s{slot}", slot),
            Work(Feeding([40 + slot], pick=pick), 1, True, loop.create_future()),
            offset=0,
            length=1,
            start=0,
        )
        for slot in range(rows)
    ]


async def test_decode_steps_run_eager_for_want_of_a_graph_are_counted(cache_dir: Path) -> None:
    """A decode-only step with more rows than ``max_rows``, or of a shape whose graph
    differs from eager, runs eager and counts; a replay, or a step run eager on purpose,
    does not; a model without graphs counts nothing (None)."""
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 8}
    graphed = ThinkerModel(
        path, **common, max_context=256, max_rows=2, graphs=True, warm=True, capture=Captures()
    )
    assert graphed.eager_steps == 0
    graphed.step(decode_chunks(2))
    graphed.step(decode_chunks(1))
    assert graphed.eager_steps == 0  # replayed
    graphed.step(decode_chunks(3), eager=True)
    graphed.step(decode_chunks(2), eager=True)
    assert graphed.eager_steps == 0  # eager on purpose
    graphed.step(decode_chunks(3))
    assert graphed.eager_steps == 1  # more rows than max_rows
    graphed.step(decode_chunks(4))
    assert graphed.eager_steps == 2

    differs = ThinkerModel(
        path, **common, max_context=256, max_rows=2, graphs=True, capture=Differs()
    )
    differs.step(decode_chunks(1))  # its graph, captured now, differs: eager
    differs.step(decode_chunks(1))
    assert differs.graphed == []
    assert differs.eager_steps == 2

    plain = ThinkerModel(path, **common, max_context=256)
    plain.step(decode_chunks(3))
    assert plain.eager_steps is None


async def test_first_prompts_replay_a_fresh_prefill_graph_and_pick_as_eager(
    cache_dir: Path,
) -> None:
    """With ``prefill_graphs``, a request's chunks from the start of its slot replay the
    prefill graph of their length bucket (padded at the end), alone or beside other
    sessions' decode rows and later chunks, which run as before: every session's tokens
    and talker rows are the eager model's; a graph that differs from eager leaves its
    length eager, counted."""
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 8}
    graphs: dict[str, Any] = {"graphs": True, "prefill_graphs": True, "prefill_bucket": 32}
    captures = Captures()
    graphed = ThinkerModel(path, **common, max_context=256, capture=captures, **graphs)
    assert graphed.prefill_sizes() == [32, 64, 96, 128, 160, 192, 224, 256]
    eager = ThinkerModel(path, **common, max_context=256)
    want = await alone(eager)
    whole = await alone(graphed)  # prompts of 50, 17 and 90: the 64, 32 and 96 graphs
    assert graphed.prefill_graphed == [(1, 32), (1, 64), (1, 96)]

    def replays() -> dict[int, int]:
        # The prefill graphs' outputs: last hidden states and the talker's source rows.
        fresh = [g for g in captures.graphs if len(g.outputs) == 2]
        return {g.outputs[0].shape[0]: g.replays for g in fresh}

    # Each first call ran eager and captured its graph, which replayed once (its check).
    assert replays() == {64: 1, 32: 1, 96: 1}
    chunked = await alone(graphed, max_chunk=20, budget=24)  # a fresh first chunk, then not
    assert replays() == {64: 1, 32: 1 + 3, 96: 1}
    # Sessions together: fresh prompts beside others' decode rows, one step.
    loop = loop_over(graphed, max_chunk=128, budget=64)
    loop.start()
    pairs = enumerate(zip(PROMPTS, picks(), strict=True))
    together = await asyncio.gather(*(session(loop, f"t{i}", p, pick) for i, (p, pick) in pairs))
    await loop.stop()
    assert loop.statistics().mixed_steps > 0
    assert graphed.eager_steps == 0
    for got in (whole, chunked, together):
        for (tokens, rows), (want_tokens, want_rows) in zip(got, want, strict=True):
            assert tokens == want_tokens
            torch.testing.assert_close(rows, want_rows, rtol=1e-4, atol=1e-5)

    differs = ThinkerModel(path, **common, max_context=256, capture=Differs(), **graphs)
    for (tokens, _), (want_tokens, _) in zip(await alone(differs), want, strict=True):
        assert tokens == want_tokens
    assert differs.prefill_graphed == []
    # Each prompt's fresh step and each decode step (their graphs differ too) ran eager.
    assert differs.eager_steps == 3 + 3 * STEPS


async def test_first_prompts_of_one_bucket_share_a_fresh_graph_and_pick_as_alone(
    cache_dir: Path,
) -> None:
    """With ``prefill_batch``, first prompts of one length bucket in one step run as one
    forward, replayed from the graph of their count: every session's tokens and talker
    rows are those it gets alone and eager; more prompts than ``prefill_batch`` split
    into forwards of at most that many."""
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 8}
    graphs: dict[str, Any] = {"graphs": True, "prefill_graphs": True, "prefill_bucket": 128}
    want = await alone(ThinkerModel(path, **common, max_context=256))

    async def together(model: ThinkerModel) -> list[tuple[list[int], torch.Tensor]]:
        loop = loop_over(model, max_chunk=128, budget=512)
        loop.start()
        pairs = enumerate(zip(PROMPTS, picks(), strict=True))
        got = await asyncio.gather(*(session(loop, f"t{i}", p, pick) for i, (p, pick) in pairs))
        await loop.stop()
        assert model.eager_steps == 0
        return list(got)

    for batch, shapes in ((3, [(3, 128)]), (2, [(1, 128), (2, 128)])):
        captures = Captures()
        model = ThinkerModel(
            path, **common, max_context=256, capture=captures, prefill_batch=batch, **graphs
        )
        got = await together(model)  # prompts of 50, 17 and 90: all in the 128 bucket
        assert model.prefill_graphed == shapes
        for (tokens, rows), (want_tokens, want_rows) in zip(got, want, strict=True):
            assert tokens == want_tokens
            torch.testing.assert_close(rows, want_rows, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True])
async def test_decode_rows_ride_in_a_fresh_prefill_graph_and_pick_as_alone(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    """With ``prefill_rows``, a step's decode rows beside first prompts run in the first
    prompts' fresh forward (a graph per shape that takes that many rows, padded), its layers
    compiled or not: every session's tokens and talker rows are those it gets alone and
    eager, and no such step runs a forward of its rows apart."""
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 8}
    want = await alone(ThinkerModel(path, **common, max_context=256))
    extra: dict[str, Any] = {"compile_prefill": Backend()} if compiled else {}
    captures = Captures()
    model = ThinkerModel(
        path,
        **common,
        max_context=256,
        graphs=True,
        capture=captures,
        prefill_graphs=True,
        prefill_bucket=32,
        prefill_rows=4,
        **extra,
    )
    apart: set[int] = set()  # the chunks run by a forward of rows
    rows_step = model._rows_step

    def counted(chunks: list[ThinkerChunk], eager: bool) -> list[Fed]:
        apart.update(id(chunk) for chunk in chunks)
        return rows_step(chunks, eager)

    monkeypatch.setattr(model, "_rows_step", counted)
    steps: list[list[ThinkerChunk]] = []

    async def execute(chunks: list[ThinkerChunk]) -> list[Fed]:
        steps.append(chunks)
        return model.step(chunks)

    # The 50-position prompt first; the others, one a step, beside its decode rows.
    loop = StepLoop(execute, slots=8, max_context=256, max_tokens_per_step=60, max_chunk=128)
    loop.start()
    pairs = enumerate(zip(PROMPTS, picks(), strict=True))
    together = await asyncio.gather(*(session(loop, f"t{i}", p, pick) for i, (p, pick) in pairs))
    await loop.stop()
    beside = [
        chunks
        for chunks in steps
        if any(c.work.decode for c in chunks) and any(c.start == 0 for c in chunks)
    ]
    assert beside, "no step ran a first prompt beside decode rows"
    assert not any(id(c) in apart for chunks in beside for c in chunks if c.work.decode)
    assert all(id(c) in apart for chunks in steps[-3:] for c in chunks)  # decode alone
    assert model.eager_steps == 0
    for (tokens, rows), (want_tokens, want_rows) in zip(together, want, strict=True):
        assert tokens == want_tokens
        torch.testing.assert_close(rows, want_rows, rtol=1e-4, atol=1e-5)
    # A step with decode rows replayed a graph taking four more than its runs' positions;
    # the first step, without, one of its runs' alone.
    fresh = [g for g in captures.graphs if len(g.outputs) == 2]
    assert {g.outputs[0].shape[0] % 32 for g in fresh} == {0, 4}
    assert (1, 64, 4) in model.prefill_graphed


@pytest.mark.usefixtures("fresh_compiles")
async def test_fresh_prefill_graphs_captured_at_load_run_the_compiled_layers(
    cache_dir: Path,
) -> None:
    """Warm, every fresh prefill shape (length, and runs of one length up to
    ``prefill_batch``) is captured at load through the compiled prefill layers (after
    their compile), and serving compiles nothing more: the tokens and rows are the eager
    model's."""
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 4}
    backend = Backend()
    graphed = ThinkerModel(
        path,
        **common,
        max_context=128,
        graphs=True,
        warm=True,
        capture=Captures(),
        compile_prefill=backend,
        prefill_graphs=True,
        prefill_bucket=64,
        prefill_batch=2,
    )
    assert graphed.prefill_graphed == [(1, 64), (1, 128), (2, 64), (2, 128)]
    assert graphed.prefill_compiled == "compiled"
    at_load, runs = list(backend.graphs), backend.runs
    want = await alone(ThinkerModel(path, **common, max_context=128))
    for (tokens, rows), (want_tokens, want_rows) in zip(await alone(graphed), want, strict=True):
        assert tokens == want_tokens
        torch.testing.assert_close(rows, want_rows, rtol=1e-4, atol=1e-5)
    assert backend.runs > runs  # the replays ran the compiled layers
    # A prompt in chunks: its first replays, the rest run the compiled prefill forward.
    for (tokens, _), (want_tokens, _) in zip(
        await alone(graphed, max_chunk=20, budget=24), want, strict=True
    ):
        assert tokens == want_tokens
    # Sessions together: replays beside later chunks and others' decode rows in one step.
    loop = loop_over(graphed, max_chunk=40, budget=48)
    loop.start()
    pairs = enumerate(zip(PROMPTS, picks(), strict=True))
    together = await asyncio.gather(*(session(loop, f"t{i}", p, pick) for i, (p, pick) in pairs))
    await loop.stop()
    assert loop.statistics().mixed_steps > 0
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in want]
    # First prompts together: the two of the 64 bucket in one replay.
    loop = loop_over(graphed, max_chunk=128, budget=512)
    loop.start()
    pairs = enumerate(zip(PROMPTS, picks(), strict=True))
    together = await asyncio.gather(*(session(loop, f"u{i}", p, pick) for i, (p, pick) in pairs))
    await loop.stop()
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in want]
    assert backend.graphs == at_load
    assert graphed.eager_steps == 0


# -- through the engine: structure ---------------------------------------------------------


@asynccontextmanager
async def thinker(cache_dir: Path, **extra: Any) -> AsyncIterator[ThinkerEngine]:
    args = ThinkerArgs(
        seed=0,
        cache_dir=str(cache_dir),
        min_new_tokens=8,
        allowed_token_ranges=PRINTABLE_RANGES,
        **extra,
    )
    engine = ThinkerEngine(args)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def reply(engine: ThinkerEngine, session: str, text: str) -> list[int]:
    async def inputs() -> AsyncIterator[Fields]:
        yield {"text": text}

    ids = []
    async for out in engine.generate(session, inputs()):
        token = out.get("token_ids")
        if isinstance(token, torch.Tensor):
            ids.append(int(token))
    return ids


def test_chosen_fresh_prefill_graphs_are_captured_and_unknown_shapes_refused(
    cache_dir: Path,
) -> None:
    """``warm_prefill_graphs(keys)`` captures those shapes alone (a profile of one shape
    does not capture every other); a shape the model has no graph for is refused."""
    path = cache_dir / "tiny-omni" / "seed-0"
    model = ThinkerModel(
        path,
        allowed_token_ranges=PRINTABLE_RANGES,
        slots=4,
        max_context=128,
        graphs=True,
        capture=Captures(),
        prefill_graphs=True,
        prefill_bucket=64,
        prefill_batch=2,
        prefill_rows=2,
    )
    assert model.warm_prefill_graphs([(2, 64), (1, 128, 2)]) == [(1, 128, 2), (2, 64)]
    with pytest.raises(ValueError, match=r"no fresh prefill graph has the shapes \[\(3, 64\)\]"):
        model.warm_prefill_graphs([(3, 64)])
    assert model.prefill_graphed == [(1, 128, 2), (2, 64)]


def test_a_thinker_with_prefill_graphs_keeps_first_prompts_whole(cache_dir: Path) -> None:
    """A first prompt split by a step's budget would replay its graph for one part and
    run the rest as a forward of its own: with fresh prefill graphs (by default wherever
    steps replay graphs) the loop keeps it whole; elsewhere nothing replays, and it
    splits prompts by the budget."""
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert ThinkerArgs().prefill_graphs_on(cuda)
    assert not ThinkerArgs(prefill_graphs=False).prefill_graphs_on(cuda)
    assert not ThinkerArgs(static_cache=False).prefill_graphs_on(cuda)
    assert not ThinkerArgs().prefill_graphs_on(cpu)
    args = ThinkerArgs(seed=0, cache_dir=str(cache_dir))
    assert ThinkerEngine(args).loop.whole_fresh_prefills is False  # on the CPU


def test_the_thinker_s_loop_runs_young_rows_ahead_as_its_args_say(cache_dir: Path) -> None:
    args = ThinkerArgs(seed=0, cache_dir=str(cache_dir))
    assert ThinkerEngine(args).loop.decode_ahead == 0
    ahead = ThinkerArgs(seed=0, cache_dir=str(cache_dir), decode_ahead=3)
    assert ThinkerEngine(ahead).loop.decode_ahead == 3


def test_the_thinker_on_a_gpu_keeps_first_prompts_whole(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine sets its loop by where it computes (its device resolved, not loaded)."""
    monkeypatch.setattr(thinker_engine, "release_dir", lambda *_: cache_dir)
    monkeypatch.setattr(torch_engine, "resolve_device", lambda _: torch.device("cuda", 0))
    assert ThinkerEngine(ThinkerArgs(device="cuda")).loop.whole_fresh_prefills is True
    off = ThinkerArgs(device="cuda", prefill_graphs=False)
    assert ThinkerEngine(off).loop.whole_fresh_prefills is False


async def test_concurrent_sessions_share_steps(cache_dir: Path) -> None:
    texts = [f"request number {i}" for i in range(6)]
    async with thinker(cache_dir, max_new_tokens=32, max_prefill_chunk=8) as engine:
        replies = await asyncio.wait_for(
            asyncio.gather(*(reply(engine, f"s{i}", t) for i, t in enumerate(texts))), 60.0
        )
        assert engine.generating == set()
        stats = engine.loop.statistics()
    for ids in replies:
        assert 8 <= len(ids) <= 32
        assert Tokens.IM_END not in ids
        assert all(32 <= token < 127 for token in ids)
    # Each later token, and the <|im_end|> of a reply under the limit, from a decode row.
    assert stats.decode_rows == sum(len(ids) - 1 + (len(ids) < 32) for ids in replies)
    assert stats.largest_step > 1
    assert stats.steps < 0.75 * (stats.decode_rows + stats.prefill_chunks)


@pytest.mark.usefixtures("fresh_compiles")
async def test_an_engine_asked_to_compile_its_prefills_replies_as_one_that_does_not(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compile_prefill`` through the engine's args: the same replies to concurrent
    sessions prefilled in chunks, and its stop ends the compile workers it started."""
    ended: list[bool] = []
    monkeypatch.setattr(thinker_engine, "end_compile_workers", lambda: ended.append(True))
    texts = [f"request number {i}" for i in range(3)]
    common: dict[str, Any] = {"max_new_tokens": 12, "max_prefill_chunk": 8}

    async def replies(**extra: Any) -> list[list[int]]:
        async with thinker(cache_dir, **common, **extra) as engine:
            if extra:
                assert engine._model.prefill_compiled == "compiled"
            return await asyncio.wait_for(
                asyncio.gather(*(reply(engine, f"s{i}", t) for i, t in enumerate(texts))), 60.0
            )

    plain = await replies()
    assert ended == []
    assert await replies(compile_prefill=True, compile_backend="aot_eager") == plain
    assert ended == [True]


async def test_an_engine_without_graphs_reports_no_eager_steps(cache_dir: Path) -> None:
    """On the CPU no step replays a graph: eager steps are not applicable (None), not 0."""
    async with thinker(cache_dir, max_new_tokens=4) as engine:
        await reply(engine, "a", "Hi")
        assert engine.eager_steps is None
        assert engine_eager_steps(engine) is None


async def test_a_session_past_max_sessions_fails_alone_with_a_typed_error(
    cache_dir: Path,
) -> None:
    async with thinker(cache_dir, max_sessions=2, max_new_tokens=8) as engine:
        await reply(engine, "a", "Hi")
        await reply(engine, "b", "Hello")
        with pytest.raises(SlotsExhaustedError, match="max_sessions"):
            await reply(engine, "c", "Hey")
        assert engine.active_sessions == {"a", "b"}
        await engine.release("a")
        assert len(await reply(engine, "c", "Hey")) == 8
        assert engine.loop.statistics().free_slots == 0


async def test_an_abort_in_the_middle_of_a_prefill_frees_the_slot(cache_dir: Path) -> None:
    """A long prompt fed 4 positions a step is aborted while its chunks run: the slot
    comes back, and the session's next conversation replies as a fresh one."""
    async with thinker(cache_dir, max_new_tokens=8, max_prefill_chunk=4) as engine:
        fresh = await reply(engine, "s", "Tell me about the sea")
        await engine.release("s")
        started = asyncio.ensure_future(reply(engine, "s", "word " * 60))
        await_chunks = engine.loop.statistics().prefill_chunks

        def prefilling() -> bool:
            return engine.loop.statistics().prefill_chunks > await_chunks + 2

        await eventually(prefilling, timeout=30.0)
        await engine.abort("s")
        await asyncio.wait_for(started, 30.0)  # ends where it waits, without a reply
        await eventually(lambda: engine.loop.statistics().free_slots == 32, timeout=30.0)
        assert await reply(engine, "s", "Tell me about the sea") == fresh


async def test_prefill_chunks_that_fit_a_graph_replay_it_and_pick_as_eager(
    cache_dir: Path,
) -> None:
    """A step whose positions fit the largest decode graph (a reply's opening, chunks of
    a prompt, beside decode rows) replays it, one row per position: the tokens and the
    talker's rows are the one-shot prefill's; chunks of up to ``ROWS_PIECES`` graphs'
    positions replay in pieces, in order; longer ones run the prefill forward."""
    path = cache_dir / "tiny-omni" / "seed-0"
    captures = Captures()
    common: dict[str, Any] = {"allowed_token_ranges": PRINTABLE_RANGES, "slots": 8}
    graphed = ThinkerModel(
        path, **common, max_context=256, max_rows=8, graphs=True, capture=captures
    )
    eager = ThinkerModel(path, **common, max_context=256)
    want = await alone(eager)
    chunked = await alone(graphed, max_chunk=5, budget=8)
    replays = captures.replays
    # Every step replayed: the prompts' chunks of 5 (10 + 4 + 18) and the decode steps.
    assert replays == 10 + 4 + 18 + 3 * STEPS
    # Chunks of 16: two replays of the 8-row graph each, in order (ROWS_PIECES).
    pieces = await alone(graphed, max_chunk=16, budget=16)
    assert ROWS_PIECES == 2
    assert captures.replays - replays == (2 * 3 + 1) + (2 + 1) + (2 * 5 + 2) + 3 * STEPS
    replays = captures.replays
    whole = await alone(graphed)  # prompts of more than 16 positions: the prefill forward
    assert captures.replays - replays == 3 * STEPS
    # Sessions together: one's chunks beside the others' decode rows, in one replay.
    loop = loop_over(graphed, max_chunk=3, budget=8)
    loop.start()
    pairs = enumerate(zip(PROMPTS, picks(), strict=True))
    together = await asyncio.gather(*(session(loop, f"t{i}", p, pick) for i, (p, pick) in pairs))
    await loop.stop()
    assert loop.statistics().mixed_steps > 0
    for got in (chunked, pieces, whole, together):
        for (tokens, rows), (want_tokens, want_rows) in zip(got, want, strict=True):
            assert tokens == want_tokens
            torch.testing.assert_close(rows, want_rows, rtol=1e-4, atol=1e-5)
