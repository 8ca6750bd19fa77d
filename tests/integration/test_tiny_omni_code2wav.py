"""``Code2WavEngine``: streamed windows decode to the one-shot audio, sessions batch.

The reference everywhere is HF's own forward over the whole code sequence at once; the
engine must reproduce it from ``ChunkPolicy`` windows, add the 555-sample tail HF trims
(so a segment of ``F`` frames is exactly ``1920 * F`` samples), share forwards between
sessions without mixing their audio, end aborted or stopped sessions at once (one in a
forward loses its row, the others keep theirs), and map the samples a user heard of the
last reply back to the frames they depend on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.contract import CONTEXT_FIELD, Fields
from omni_actors.actors.engines.qwen3_omni import configs, stepping, weights
from omni_actors.actors.engines.qwen3_omni.code2wav_engine import (
    Code2WavArgs,
    Code2WavEngine,
    Code2WavInputError,
    EngineStoppedError,
)
from omni_actors.actors.engines.qwen3_omni.code2wav_model import Code2WavModel, Piece
from omni_actors.actors.engines.registry import EngineArgsError, build_engine
from omni_actors.actors.stage.chunk_policy import ChunkPolicy
from omni_actors.models.cache import prepare
from omni_actors.testing import eventually

PER_FRAME = configs.SAMPLES_PER_FRAME
PENDING = 555
GROUPS = configs.DEFAULT_NUM_CODE_GROUPS


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache_dir = tmp_path_factory.mktemp("code2wav-cache")
    prepare("tiny-omni", cache_dir=cache_dir)
    return cache_dir


@pytest.fixture(scope="module")
def reference(cache: Path) -> Any:
    """HF's code2wav as saved, untouched: the one-shot decode every stream must match."""
    root = cache / "tiny-omni" / "seed-0"
    return weights.load(root, "code2wav")


@asynccontextmanager
async def running(cache: Path, **args: Any) -> AsyncIterator[Code2WavEngine]:
    engine = Code2WavEngine(Code2WavArgs(cache_dir=cache, **args))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


def random_codes(frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, configs.CODEBOOK_SIZE, (frames, GROUPS), generator=gen)


def windows(codes: torch.Tensor, policy: ChunkPolicy | None = None) -> list[Fields]:
    """The inputs a stage hands code2wav: frames pushed one by one, as a talker makes them."""
    window = (policy or ChunkPolicy(4, 25, 25)).window()
    chunks = [c for frame in codes for c in window.push(frame[None])] + window.finish()
    inputs: list[Fields] = []
    for chunk in chunks:
        fields: dict[str, torch.Tensor | str] = {"codes": chunk.frames}
        if chunk.context:
            fields[CONTEXT_FIELD] = torch.tensor(chunk.context)
        inputs.append(fields)
    return inputs


async def feed(items: list[Fields], stalled: asyncio.Event | None = None) -> AsyncIterator[Fields]:
    """Yield ``items``; with ``stalled``, set it after two and wait forever (a stuck talker)."""
    for index, item in enumerate(items):
        if stalled is not None and index == 2:
            stalled.set()
            await asyncio.Event().wait()
        yield item


async def decode(engine: Code2WavEngine, session: str, inputs: AsyncIterator[Fields]) -> list[Any]:
    outputs = engine.generate(session, inputs)
    return [out["audio"] for out in [o async for o in outputs]]


def one_shot(reference: Any, codes: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = reference(codes.T[None])[0, 0]
    return out


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) < 1e-5


@pytest.mark.integration
@pytest.mark.parametrize("frames", [60, 54])  # 4+25+25+6 (finish() flushes), 4+25+25 (it does not)
async def test_stream_of_windows_equals_one_shot_decode(
    cache: Path, reference: Any, frames: int
) -> None:
    codes = random_codes(frames, seed=frames)
    inputs = windows(codes)
    async with running(cache) as engine:
        pieces = await decode(engine, "s", feed(inputs))
        whole = await decode(engine, "full", feed([{"codes": codes}]))  # a full edge
        assert engine.generating == set()

    new = [4, 25, 25, 6][: len(inputs)]
    expected = [PER_FRAME * new[0] - PENDING] + [PER_FRAME * n for n in new[1:]] + [PENDING]
    assert [p.shape[-1] for p in pieces] == expected
    assert all(p.dtype == torch.float32 and p.dim() == 1 for p in pieces)
    stream = torch.cat(pieces)
    assert stream.shape[-1] == PER_FRAME * frames
    # Everything but the tail is HF's one-shot decode (which trims the tail).
    assert close(stream[:-PENDING], one_shot(reference, codes))
    # ... and so is each chunk's emitted audio, chunk by chunk (stepping's reference).
    contexts = [int(f.get(CONTEXT_FIELD, torch.tensor(0))) for f in inputs]
    steps = [
        stepping.decode_window(reference, f["codes"].T[None], c)[0]  # type: ignore[union-attr]
        for f, c in zip(inputs, contexts, strict=True)
    ]
    assert close(stream[:-PENDING], torch.cat(steps))
    # A full edge (one chunk) gives the same samples, tail included, in two outputs.
    assert [p.shape[-1] for p in whole] == [PER_FRAME * frames - PENDING, PENDING]
    assert close(torch.cat(whole), stream)
    assert float(stream[-PENDING:].abs().max()) > 1e-3  # the tail is audio, not padding


@pytest.mark.integration
async def test_any_chunking_gives_1920_samples_per_frame(cache: Path, reference: Any) -> None:
    codes = random_codes(30, seed=7)
    full = one_shot(reference, codes)
    async with running(cache) as engine:
        for policy, exact in [
            (ChunkPolicy(1, 3, 25), True),  # context always covers the receptive field
            (ChunkPolicy(4, 25, 0), False),  # no context: chunk edges are approximate
            (ChunkPolicy(2, 7, 3), False),  # context shorter than the receptive field
        ]:
            stream = torch.cat(await decode(engine, "s", feed(windows(codes, policy))))
            assert stream.shape[-1] == PER_FRAME * 30, policy
            assert close(stream[:-PENDING], full) == exact, policy
            # The first chunk is always exact: it has nothing before it.
            assert close(
                stream[: PER_FRAME * policy.initial_frames - PENDING],
                full[: PER_FRAME * policy.initial_frames - PENDING],
            )


@pytest.mark.integration
async def test_concurrent_sessions_share_forwards(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []  # rows per forward
    real = Code2WavModel.decode

    def counted(
        model: Code2WavModel, codes: torch.Tensor, starts: list[int], *, common: bool = False
    ) -> list[Piece]:
        batches.append(codes.shape[0])
        return real(model, codes, starts, common=common)

    monkeypatch.setattr(Code2WavModel, "decode", counted)
    sessions = {f"s{i}": random_codes(60, seed=100 + i) for i in range(4)}
    async with running(cache, batch_wait_ms=20) as engine:
        solo = {
            s: torch.cat(await decode(engine, s, feed(windows(c)))) for s, c in sessions.items()
        }
        assert batches == [1] * 16  # 4 chunks each, one forward per chunk
        batches.clear()

        results = await asyncio.gather(
            *(decode(engine, s, feed(windows(c))) for s, c in sessions.items())
        )
        assert sum(batches) == 16
        assert len(batches) < 16
        assert max(batches) == 4
        assert engine.eager_steps is None  # on the CPU: no graphs to fall back from
    for session, pieces in zip(sessions, results, strict=True):
        assert close(torch.cat(pieces), solo[session])


@pytest.mark.integration
async def test_abort_mid_stream_frees_session_and_others_continue(cache: Path) -> None:
    codes = {s: random_codes(60, seed=200 + i) for i, s in enumerate(["a", "b", "c"])}
    async with running(cache) as engine:
        solo = torch.cat(await decode(engine, "solo", feed(windows(codes["a"]))))
        stalled = asyncio.Event()
        a = asyncio.create_task(decode(engine, "a", feed(windows(codes["a"]))))
        b = asyncio.create_task(decode(engine, "b", feed(windows(codes["b"]), stalled)))
        await stalled.wait()  # b has yielded two chunks' audio and waits for a third
        assert "b" in engine.generating
        await engine.abort("b")
        assert "b" not in engine.generating
        b_pieces = await asyncio.wait_for(b, 5.0)  # its input never ends: only the abort
        assert len(b_pieces) == 2  # what it decoded before the abort, and no tail

        # Abort c while its chunk waits behind a model thread that the test keeps busy
        # (on an event, no time involved): it ends at once, not when the thread is free.
        free = threading.Event()
        busy = asyncio.create_task(engine.call(free.wait))
        try:
            c = asyncio.create_task(decode(engine, "c", feed(windows(codes["c"]))))
            await eventually(lambda: "c" in engine.generating)  # its chunk is queued
            await engine.abort("c")
            assert await asyncio.wait_for(c, 5.0) == []
            assert not busy.done()  # c ended while the model thread was still taken
        finally:
            free.set()
        await busy
        a_pieces = await a
        assert engine.generating == set()
    assert close(torch.cat(a_pieces), solo)


@pytest.mark.integration
async def test_windows_of_several_sessions_share_one_step_one_forward_per_length(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three sessions' windows, two of 29 frames (with and without context) and one of 5,
    run in one step of the loop: one forward per window length."""
    forwards: list[tuple[int, int]] = []  # (rows, frames) per forward
    real = Code2WavModel.decode

    def seen(
        model: Code2WavModel, codes: torch.Tensor, starts: list[int], *, common: bool = False
    ) -> list[Piece]:
        forwards.append((codes.shape[0], codes.shape[-1]))
        return real(model, codes, starts, common=common)

    monkeypatch.setattr(Code2WavModel, "decode", seen)
    replies: dict[str, list[Fields]] = {
        "p": [{"codes": random_codes(29, seed=30), CONTEXT_FIELD: torch.tensor(4)}],
        "q": [{"codes": random_codes(29, seed=31)}],
        "r": [{"codes": random_codes(5, seed=32)}],
    }
    # An idle step loop gathers 200 ms: windows submitted together share its first step.
    async with running(cache, batch_wait_ms=200) as engine:
        solo = {s: torch.cat(await decode(engine, s, feed(i))) for s, i in replies.items()}
        before = engine.loop.statistics()
        forwards.clear()
        together = await asyncio.gather(*(decode(engine, s, feed(i)) for s, i in replies.items()))
        after = engine.loop.statistics()
    assert after.steps - before.steps == 1
    assert after.decode_rows - before.decode_rows == 3
    assert after.largest_step == 3
    assert sorted(forwards) == [(1, 5), (2, 29)]
    for session, pieces in zip(replies, together, strict=True):
        assert close(torch.cat(pieces), solo[session])


@pytest.mark.integration
async def test_abort_while_a_window_waits_for_a_step_drops_only_that_session(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``b``'s and ``c``'s first windows wait in the loop behind a step that holds ``a``'s:
    aborting ``b`` ends it at once (the step still held), its window never reaches a
    forward, and ``c``'s and ``a``'s streams decode whole, as they do alone."""
    rows: list[int] = []  # rows per forward, once armed
    armed, held, free = threading.Event(), threading.Event(), threading.Event()
    real = Code2WavModel.decode

    def gated(
        model: Code2WavModel, codes: torch.Tensor, starts: list[int], *, common: bool = False
    ) -> list[Piece]:
        if armed.is_set():
            rows.append(codes.shape[0])
            if len(rows) == 1:  # a's first window: hold its step there
                held.set()
                free.wait()
        return real(model, codes, starts, common=common)

    monkeypatch.setattr(Code2WavModel, "decode", gated)
    codes = {s: random_codes(60, seed=400 + i) for i, s in enumerate("abc")}
    async with running(cache) as engine:
        solo = {s: torch.cat(await decode(engine, s, feed(windows(codes[s])))) for s in "ac"}
        armed.set()
        tasks = {"a": asyncio.create_task(decode(engine, "a", feed(windows(codes["a"]))))}
        try:
            await eventually(held.is_set)
            for s in "bc":
                tasks[s] = asyncio.create_task(decode(engine, s, feed(windows(codes[s]))))

            def waiting(session: str) -> bool:
                request = engine.loop.requests.get(session)
                return request is not None and bool(request.queue)

            await eventually(lambda: waiting("b") and waiting("c"))
            await engine.abort("b")
            assert await asyncio.wait_for(tasks["b"], 5.0) == []  # a's step still held
            assert "b" not in engine.active_sessions
            assert "b" not in engine.loop.requests
            assert waiting("c")
            assert not free.is_set()
        finally:
            free.set()
        a, c = await asyncio.wait_for(asyncio.gather(tasks["a"], tasks["c"]), 30.0)
        assert engine.generating == set()
    assert sum(rows) == 8  # a's 4 windows and c's 4: none of b's
    assert close(torch.cat(a), solo["a"])
    assert close(torch.cat(c), solo["c"])


@pytest.mark.integration
async def test_abort_mid_window_drops_its_row_and_the_batch_decodes_on(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Abort ``b`` while its window is in a forward with ``a``'s and ``c``'s: ``b`` ends at
    once (the forward still running), its state (its last reply) is gone, and ``a`` and
    ``c`` decode their whole streams, as they do alone, in forwards without ``b``."""
    batches: list[int] = []  # rows per forward, once armed
    armed, held, free = threading.Event(), threading.Event(), threading.Event()
    real = Code2WavModel.decode

    def gated(
        model: Code2WavModel, codes: torch.Tensor, starts: list[int], *, common: bool = False
    ) -> list[Piece]:
        if armed.is_set():
            batches.append(codes.shape[0])
            if len(batches) == 1:  # the sessions' first windows, batched: hold it there
                held.set()
                free.wait()
        return real(model, codes, starts, common=common)

    monkeypatch.setattr(Code2WavModel, "decode", gated)
    codes = {s: random_codes(60, seed=300 + i) for i, s in enumerate("abc")}
    # An idle step loop gathers 200 ms, so the three first windows share the first forward.
    async with running(cache, batch_wait_ms=200) as engine:
        # Each session's reply alone first: the reference, and state that b must lose.
        solo = {s: torch.cat(await decode(engine, s, feed(windows(c)))) for s, c in codes.items()}
        assert engine.active_sessions == {"a", "b", "c"}
        armed.set()
        tasks = {
            s: asyncio.create_task(decode(engine, s, feed(windows(c)))) for s, c in codes.items()
        }
        try:
            await eventually(held.is_set)
            assert batches == [3]
            await engine.abort("b")
            assert await asyncio.wait_for(tasks["b"], 5.0) == []  # while the forward runs
            assert "b" not in engine.active_sessions
            with pytest.raises(ValueError, match="no reply to truncate"):
                await engine.truncate("b", 100)
            assert not free.is_set()
        finally:
            free.set()
        a, c = await asyncio.wait_for(asyncio.gather(tasks["a"], tasks["c"]), 30.0)
        assert engine.generating == set()
        assert engine.active_sessions == {"a", "c"}  # their replies, until release
        assert max(batches[1:]) <= 2  # b's later windows never reached a forward
    assert close(torch.cat(a), solo["a"])
    assert close(torch.cat(c), solo["c"])


@pytest.mark.integration
async def test_bad_chunk_fails_only_its_session(cache: Path) -> None:
    good = random_codes(30, seed=3)
    async with running(cache) as engine:
        ok = asyncio.create_task(decode(engine, "ok", feed(windows(good))))
        with pytest.raises(Code2WavInputError, match="lie in"):
            await decode(engine, "bad", feed([{"codes": good + configs.CODEBOOK_SIZE}]))
        with pytest.raises(Code2WavInputError, match=r"\[frames, 4\]"):
            await decode(engine, "bad", feed([{"codes": good[:, :3]}]))
        assert sum(p.shape[-1] for p in await ok) == PER_FRAME * 30
        assert engine.generating == set()


@pytest.mark.integration
async def test_stop_ends_generating_sessions_and_leaves_no_task(cache: Path) -> None:
    engine = Code2WavEngine(Code2WavArgs(cache_dir=cache))
    with pytest.raises(EngineStoppedError):
        await decode(engine, "early", feed([]))
    await engine.start()
    stalled = asyncio.Event()
    session = asyncio.create_task(decode(engine, "s", feed(windows(random_codes(30, 4)), stalled)))
    await stalled.wait()
    await engine.stop()
    # Ended as an abort ends it (its input never ends): what it decoded, and no tail.
    assert len(await asyncio.wait_for(session, 5.0)) == 2
    assert engine.generating == set()
    assert engine.active_sessions == set()
    current = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not current and not t.done()] == []
    with pytest.raises(EngineStoppedError):
        await decode(engine, "late", feed([]))


@pytest.mark.integration
def test_args_are_checked(cache: Path) -> None:
    with pytest.raises(EngineArgsError, match=r"args\.max_btach: Extra inputs"):
        build_engine("qwen3-omni.code2wav", {"cache_dir": str(cache), "max_btach": 4})
    with pytest.raises(EngineArgsError, match=r"args\.max_batch: Input should be greater"):
        build_engine("qwen3-omni.code2wav", {"cache_dir": str(cache), "max_batch": 0})


@pytest.mark.integration
async def test_truncate_maps_heard_samples_to_the_frames_they_depend_on(
    cache: Path, reference: Any
) -> None:
    """Checked against the decoder itself: frame ``n`` first changes sample
    ``1920 * n - 555`` (the first window lacks the 555 samples held back for the next)."""
    frames = 12
    codes = random_codes(frames, seed=11)
    async with running(cache) as engine:

        async def cut(kept: int) -> int:
            await decode(engine, "s", feed(windows(codes)))  # the whole reply, then cut it
            return await engine.truncate("s", kept)

        heard = torch.cat(await decode(engine, "heard", feed(windows(codes))))
        assert heard.shape[-1] == PER_FRAME * frames
        for n in (1, 2, 5, 11):
            changed = codes.clone()
            changed[n] = (changed[n] + 1) % configs.CODEBOOK_SIZE
            other = torch.cat(await decode(engine, "other", feed(windows(changed))))
            first = int((other != heard).nonzero()[0])
            assert first == PER_FRAME * n - PENDING, n
            # The samples before it do not need frame n; the one at it does.
            assert await cut(first) == n
            assert await cut(first + 1) == n + 1
        cases = {0: 0, 1: 1, PER_FRAME - PENDING: 1, PER_FRAME - PENDING + 1: 2}
        cases |= {PER_FRAME * frames - PENDING: frames, PER_FRAME * frames: frames}
        cases |= {PER_FRAME * frames + 5000: frames}
        for kept, expected in cases.items():
            assert await cut(kept) == expected, kept
        # A truncated reply stays truncated: a later, longer cut keeps what is left.
        assert await engine.truncate("s", PER_FRAME * 3) == 4
        assert await engine.truncate("s", PER_FRAME * 8) == 4
        assert await engine.truncate("s", 100) == 1


@pytest.mark.integration
async def test_truncate_needs_a_reply_and_release_forgets_it(cache: Path) -> None:
    codes = random_codes(8, seed=12)
    async with running(cache) as engine:
        with pytest.raises(ValueError, match="no reply to truncate"):
            await engine.truncate("s", 100)
        await decode(engine, "s", feed(windows(codes)))
        assert engine.generating == set()
        assert engine.active_sessions == {"s"}  # its last reply, until release
        with pytest.raises(ValueError, match="pass 0 or more"):
            await engine.truncate("s", -1)
        # A failed reply leaves the last one in place.
        with pytest.raises(Code2WavInputError):
            await decode(engine, "s", feed([*windows(codes[:5])[:1], {"codes": codes[:, :3]}]))
        assert await engine.truncate("s", 10**9) == 8
        # A cancelled one (closed at a yield) replaces it with what had arrived.
        outputs = engine.generate("s", feed(windows(random_codes(30, seed=13))))
        await anext(outputs)
        await outputs.aclose()
        assert await engine.truncate("s", 10**9) == 4  # the first window's 4 frames
        await engine.release("s")
        assert engine.active_sessions == set()
        with pytest.raises(ValueError, match="no reply to truncate"):
            await engine.truncate("s", 100)
        await decode(engine, "t", feed(windows(codes)))
        await engine.abort("t")
        assert engine.active_sessions == set()
        with pytest.raises(ValueError, match="no reply to truncate"):
            await engine.truncate("t", 100)


@pytest.mark.integration
async def test_window_shapes_that_recur_are_marked_common(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window shape is common (graphed on a GPU) once a window of that shape was followed
    by another in its segment: a stream's last, short chunk never is, unless warmed."""
    calls: list[tuple[int, bool]] = []  # (frames, common) per forward
    real = Code2WavModel.decode

    def seen(
        model: Code2WavModel, codes: torch.Tensor, starts: list[int], *, common: bool = False
    ) -> list[Piece]:
        calls.append((codes.shape[-1], common))
        return real(model, codes, starts, common=common)

    monkeypatch.setattr(Code2WavModel, "decode", seen)
    inputs = windows(random_codes(60, seed=20))  # (4, 0), (29, 4), (50, 25), last (31, 25)
    async with running(cache) as engine:
        first = await decode(engine, "a", feed(inputs))
        assert calls == [(4, False), (29, False), (50, False), (31, False)]
        calls.clear()
        again = await decode(engine, "b", feed(inputs))
        assert calls == [(4, True), (29, True), (50, True), (31, False)]
        # A reply of one window (a full edge) teaches nothing.
        calls.clear()
        await decode(engine, "c", feed([{"codes": random_codes(31, seed=21)}]))
        await decode(engine, "c", feed([{"codes": random_codes(31, seed=21)}]))
        assert calls == [(31, False), (31, False)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))

    calls.clear()
    warm = [{"frames": 31, "left_context": 25}, {"frames": 4}]
    async with running(cache, warm_windows=warm) as engine:
        await decode(engine, "a", feed(inputs))
        assert calls == [(4, True), (29, False), (50, False), (31, True)]


@pytest.mark.integration
def test_warm_windows_are_checked(cache: Path) -> None:
    with pytest.raises(EngineArgsError, match=r"left_context \(25\) must be below frames \(25\)"):
        build_engine(
            "qwen3-omni.code2wav",
            {"cache_dir": str(cache), "warm_windows": [{"frames": 25, "left_context": 25}]},
        )
    with pytest.raises(
        EngineArgsError, match=r"graph_batches\[0\]: Input should be greater than 0"
    ):
        build_engine("qwen3-omni.code2wav", {"cache_dir": str(cache), "graph_batches": [0]})


@pytest.mark.integration
async def test_a_forward_is_common_only_if_all_its_windows_are(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, bool]] = []  # (rows, common) per forward
    real = Code2WavModel.decode

    def seen(
        model: Code2WavModel, codes: torch.Tensor, starts: list[int], *, common: bool = False
    ) -> list[Piece]:
        calls.append((codes.shape[0], common))
        return real(model, codes, starts, common=common)

    monkeypatch.setattr(Code2WavModel, "decode", seen)
    context = torch.tensor(4)
    steady = [{"codes": random_codes(29, seed=22), CONTEXT_FIELD: context}]
    # An idle step loop gathers 200 ms: windows submitted together share a forward.
    async with running(cache, batch_wait_ms=200) as engine:
        await decode(engine, "t", feed([*steady, {"codes": random_codes(5, seed=23)}]))
        await decode(engine, "t", feed(steady))
        assert calls[-1] == (1, True)  # (29 frames, 4 of context) was followed: common
        calls.clear()
        # The same length without context (a whole reply) is not: their forward is not.
        await asyncio.gather(
            decode(engine, "p", feed(steady)),
            decode(engine, "q", feed([{"codes": random_codes(29, seed=24)}])),
        )
        assert calls == [(2, False)]
