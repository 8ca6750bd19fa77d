"""The talker steps the frames of concurrent sessions in shared steps of its step loop.

Two kinds of test, kept apart on purpose. Exactness is pinned where the steps are
deterministic: :class:`TalkerModel` driven by a step loop directly, three sessions of
different lengths stepped together (replayed from graphs, compiled or not), each frame
compared with the same session stepped alone. Through the engine, which sessions share a
step depends on timing, so those tests assert structure only: frame counts, codes in
range, steps shared, failures confined to the sessions of the failed step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from graph_standins import Backend, Captures, Differs
from tiny_omni_ids import (
    PRINTABLE_RANGES,
    TINY_TALKER,
)

from omni_actors.actors.engines import torch_engine
from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.qwen3_omni import configs, slot_decode, talker_engine
from omni_actors.actors.engines.qwen3_omni.frame_compile import (
    CompiledCodePredictor,
    FrameCompile,
)
from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs, TalkerEngine
from omni_actors.actors.engines.qwen3_omni.talker_input import ReplyInput
from omni_actors.actors.engines.qwen3_omni.talker_model import (
    PREFIX,
    ROWS_PIECES,
    Frame,
    Framed,
    TalkerChunk,
    TalkerFeed,
    TalkerModel,
)
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.actors.engines.step_loop import Chunk, Request, StepLoop, Work
from omni_actors.models import cache as model_cache
from omni_actors.testing import eventually

pytestmark = pytest.mark.integration

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# Each text with its reply's token limits (min, max). With the seed-0 weights the talker
# picks codec EOS before the end of the second reply and not in the others: with
# stop_at_codec_eos, that row leaves the batch while the others go on.
TEXTS = {
    "Hello there!": (128, 128),
    "What is the weather like today?": (128, 128),
    "Thanks.": (8, 48),
}
TALKER_FIELDS = tuple(TalkerEngine.inputs)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("model-cache")
    model_cache.prepare("tiny-omni", cache_dir=cache)
    return cache


async def _reply(cache_dir: Path, text: str, min_tokens: int, max_tokens: int) -> list[Fields]:
    args = ThinkerArgs(
        seed=0,
        cache_dir=str(cache_dir),
        min_new_tokens=min_tokens,
        max_new_tokens=max_tokens,
        allowed_token_ranges=PRINTABLE_RANGES,
    )
    thinker = ThinkerEngine(args)
    await thinker.start()
    try:
        return [out async for out in thinker.generate("s", _feed([{"text": text}]))]
    finally:
        await thinker.stop()


async def _said(cache_dir: Path) -> list[list[Fields]]:
    return [await _reply(cache_dir, text, *limits) for text, limits in TEXTS.items()]


@pytest.fixture(scope="module")
def said(cache_dir: Path) -> list[list[Fields]]:
    """The thinker's outputs for each of ``TEXTS``: user turns of different lengths."""
    return asyncio.run(_said(cache_dir))


async def _feed(items: Iterable[Fields]) -> AsyncIterator[Fields]:
    for item in items:
        yield item


def edge(outputs: list[Fields]) -> list[Fields]:
    """What a ``stream`` thinker -> talker edge delivers: one chunk per output."""
    return [{k: v for k, v in o.items() if k in TALKER_FIELDS} for o in outputs]


def reply_input(outputs: list[Fields]) -> ReplyInput:
    got = ReplyInput()
    for chunk in edge(outputs):
        got.take(chunk)
    got.ended = True
    return got


# -- sessions stepped together, driven directly ------------------------------------------

Loop = StepLoop[TalkerFeed, Framed | None]


def loop_over(model: TalkerModel) -> Loop:
    async def execute(chunks: list[TalkerChunk]) -> list[Framed | None]:
        return model.step(chunks)

    loop: Loop = StepLoop(
        execute,
        slots=model.cache.slots,
        max_context=model.cache.max_len,
        max_tokens_per_step=8192,
        max_chunk=4096,
    )
    loop.start()
    return loop


@dataclass
class SteppedReply:
    """One session's reply being stepped by the test."""

    got: ReplyInput
    request: Request[TalkerFeed, Framed | None]
    frame: Frame
    codes: list[torch.Tensor]

    def feed(self) -> TalkerFeed | None:
        """The next frame's work, or None when the reply is over (EOS or all frames)."""
        if self.frame is None or len(self.codes) >= 2 * len(self.got.embeds):
            return None
        return TalkerFeed(carry=self.frame[1], text=self.got.text(len(self.codes)), frame=True)

    def take(self, framed: Framed | None) -> None:
        assert framed is not None, "a frame step makes a frame"
        self.frame = framed.settled()
        if self.frame is not None:
            self.codes.append(self.frame[0])


async def open_replies(
    model: TalkerModel, loop: Loop, said: list[list[Fields]]
) -> list[SteppedReply]:
    """Each reply's user rows and assistant prefix, prefilled in one step; frame 0."""
    replies, opened = [], []
    for n, outputs in enumerate(said):
        got = reply_input(outputs)
        rows, mask = got.take_user()
        assert got.opening is not None
        assert got.tts is not None
        speaker = model.speakers["chelsie"]
        inputs = model.opening_inputs(rows, mask, got.opening, got.tts, got.embeds[0], speaker)
        request = loop.open(f"s{n}")
        opened.append(loop.submit(request, TalkerFeed(inputs, frame=True), len(inputs)))
        replies.append(SteppedReply(got, request, None, []))
    for reply, outputs in zip(replies, opened, strict=True):
        reply.take((await outputs)[-1])
    return replies


async def step_together(loop: Loop, replies: list[SteppedReply]) -> bool:
    """One frame of every live reply, queued together (so one step); False if none."""
    live = [(reply, feed) for reply in replies if (feed := reply.feed()) is not None]
    futures = [loop.submit(reply.request, feed, 1, decode=True) for reply, feed in live]
    for (reply, _), future in zip(live, futures, strict=True):
        (framed,) = await future
        reply.take(framed)
    return bool(live)


async def speak(loop: Loop, replies: list[SteppedReply]) -> None:
    """Step ``replies`` to their ends, every live one in each step."""
    while await step_together(loop, replies):
        pass


async def solo_replies(model: TalkerModel, said: list[list[Fields]]) -> list[SteppedReply]:
    replies = []
    for outputs in said:
        loop = loop_over(model)
        (reply,) = await open_replies(model, loop, [outputs])
        await speak(loop, [reply])
        await loop.stop()
        replies.append(reply)
    return replies


async def test_sessions_stepped_together_get_their_solo_codes(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """Sessions of different lengths (their user turns differ) stepped together get the
    frames each gets alone, EOS where it comes alone included.

    Exact codes, though a step of several changes float sums in the last bits (the
    talker's logits then differ from the solo run's by ~1e-7): with the seed-0 weights no
    pick on these replies is that close to a tie. Should another CPU's arithmetic flip
    one, compare the talker's logits within such a tolerance instead.
    """
    model = TalkerModel(cache_dir / "tiny-omni" / "seed-0", stop_at_codec_eos=True)
    alone = await solo_replies(model, said)
    loop = loop_over(model)
    together = await open_replies(model, loop, said)
    assert len({reply.request.computed for reply in together}) == len(said)
    await speak(loop, together)
    stats = loop.statistics()
    await loop.stop()
    # The second row picks codec EOS and leaves the steps; the others go on to their ends.
    ended = [len(reply.codes) < 2 * len(reply.got.embeds) for reply in alone]
    assert ended == [False, True, False]
    assert len(alone[1].codes) < max(len(alone[0].codes), len(alone[2].codes))
    for solo, batched in zip(alone, together, strict=True):
        assert torch.equal(torch.cat(batched.codes), torch.cat(solo.codes))
    assert stats.largest_step == len(said)


# -- through the engine: structure -------------------------------------------------------


@asynccontextmanager
async def talker(cache_dir: Path, **extra: Any) -> AsyncIterator[TalkerEngine]:
    extra = {**TINY_TALKER, **extra}
    engine = TalkerEngine(TalkerArgs(seed=0, cache_dir=str(cache_dir), **extra))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def frames(engine: TalkerEngine, session: str, outputs: list[Fields]) -> torch.Tensor:
    got = [out["codes"] async for out in engine.generate(session, _feed(edge(outputs)))]
    assert all(isinstance(codes, torch.Tensor) for codes in got)
    return torch.cat([codes for codes in got if isinstance(codes, torch.Tensor)])


def tokens(outputs: list[Fields]) -> int:
    return sum(1 for out in outputs if "token_ids" in out)


@pytest.mark.parametrize("max_batch", [16, 2])
async def test_concurrent_sessions_share_steps(
    cache_dir: Path, said: list[list[Fields]], max_batch: int
) -> None:
    sessions = [said[i % len(said)] for i in range(6)]
    async with talker(cache_dir, max_batch=max_batch) as engine:
        replies = await asyncio.wait_for(
            asyncio.gather(*(frames(engine, f"s{i}", o) for i, o in enumerate(sessions))), 60.0
        )
        assert engine.generating == set()
        stats = engine.loop.statistics()
        assert engine.eager_steps is None  # on the CPU: no graphs to fall back from
    for outputs, codes in zip(sessions, replies, strict=True):
        assert codes.shape == (2 * tokens(outputs), configs.DEFAULT_NUM_CODE_GROUPS)
        assert int(codes.min()) >= 0
        assert int(codes.max()) < configs.CODEBOOK_SIZE
    # Frame 0 comes with each session's opening; every later frame is a frame row.
    assert stats.decode_rows == sum(len(codes) - 1 for codes in replies)
    assert stats.largest_step > 1
    assert stats.steps < 0.75 * (stats.decode_rows + stats.prefill_chunks)  # mostly shared


def fail_when_shared(step: Any) -> Any:
    def failing(chunks: list[TalkerChunk], **kwargs: Any) -> Any:
        if len(chunks) > 1:
            raise RuntimeError("batched forward failed")
        return step(chunks, **kwargs)

    return failing


async def test_a_failed_batch_fails_its_sessions_alone_and_each_rolls_back(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """Sessions in a failed step fail (their user turns rolled back); the engine serves
    the next responses, and a session stepping alone never failed."""
    async with talker(cache_dir) as engine:
        model = engine._model
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(model, "step", fail_when_shared(model.step))
            outcomes = await asyncio.wait_for(
                asyncio.gather(
                    *(frames(engine, f"s{i}", o) for i, o in enumerate(said)),
                    return_exceptions=True,
                ),
                60.0,
            )
            assert engine.loop.statistics().largest_step > 1
            failed = [i for i, out in enumerate(outcomes) if isinstance(out, Exception)]
            assert failed, "no forward was shared"
            for index in failed:
                assert str(outcomes[index]) == "batched forward failed"
                assert engine.user_positions(f"s{index}") == 0  # rolled back to its start
            assert engine.generating == set()
            # Alone, each session steps without a batch: it succeeds.
            alone = await frames(engine, "alone", said[1])
            assert alone.shape[0] == 2 * tokens(said[1])
        # The failed sessions go on as fresh ones.
        again = await asyncio.gather(*(frames(engine, f"s{i}", said[i]) for i in failed))
    for index, codes in zip(failed, again, strict=True):
        assert codes.shape[0] == 2 * tokens(said[index])


async def speak_in(loop: Loop, replies: list[SteppedReply], groups: list[list[int]]) -> None:
    """Step the first ``STATIC_FRAMES`` frames of ``replies``, each round one step per
    group of reply indices."""
    for _ in range(STATIC_FRAMES):
        for group in groups:
            live = [replies[i] for i in group if len(replies[i].codes) < STATIC_FRAMES]
            await step_together(loop, live)


STATIC_FRAMES = 16


@pytest.fixture(scope="module")
def solo(cache_dir: Path, said: list[list[Fields]]) -> list[SteppedReply]:
    """Each session's first frames, stepped alone and eagerly (rows gathered)."""
    eager = TalkerModel(
        cache_dir / "tiny-omni" / "seed-0", stop_at_codec_eos=True, decode_attention="gather"
    )

    async def run() -> list[SteppedReply]:
        replies = []
        for outputs in said:
            loop = loop_over(eager)
            (reply,) = await open_replies(eager, loop, [outputs])
            await speak_in(loop, [reply], [[0]])
            await loop.stop()
            replies.append(reply)
        return replies

    return asyncio.run(run())


@pytest.mark.parametrize("groups", [[[0, 1, 2]], [[0, 1], [2]]], ids=["three", "two-one"])
async def test_frames_replayed_from_graphs_give_each_session_its_solo_codes(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply], groups: list[list[int]]
) -> None:
    """Frame-only steps through a graph per (row bucket, span), captured at load by a
    stand-in capture (the steps a GPU replays), equal each session's solo eager frames,
    whichever sessions share a step."""
    path = cache_dir / "tiny-omni" / "seed-0"
    captures = Captures()
    graphed = TalkerModel(
        path,
        stop_at_codec_eos=True,
        slots=4,
        max_context=512,
        max_rows=3,
        graphs=True,
        warm=True,
        capture=captures,
    )
    assert graphed.graphed == [(rows, span) for rows in (1, 2, 3) for span in (256, 512)]
    loop = loop_over(graphed)
    together = await open_replies(graphed, loop, said)
    before = captures.replays
    await speak_in(loop, together, groups)
    await loop.stop()
    assert captures.replays > before
    for reply, alone in zip(together, solo, strict=True):
        assert len(reply.codes) == len(alone.codes) > 1
        assert torch.equal(torch.cat(reply.codes), torch.cat(alone.codes))


@pytest.mark.skipif(
    not slot_decode.serves(torch.zeros(1, 1, 1, 16, device=DEVICE), 1),
    reason="Triton runs on a GPU or in its interpreter (TRITON_INTERPRET=1)",
)
@pytest.mark.parametrize("groups", [[[0, 1, 2]], [[0, 1], [2]]], ids=["three", "two-one"])
async def test_frames_with_rows_read_in_place_give_each_session_its_solo_codes(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply], groups: list[list[int]]
) -> None:
    """With ``decode_attention="triton"`` the backbone's frame rows attend their slots in
    place (eagerly and from graphs): each session's codes are its solo eager frames'."""
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"stop_at_codec_eos": True, "slots": 4, "max_context": 512}
    for graphs in (False, True):
        extra: dict[str, Any] = {"graphs": True, "warm": True, "capture": Captures()}
        model = TalkerModel(
            path, **common, max_rows=3, decode_attention="triton", **(extra if graphs else {})
        )
        assert model.cache.in_place
        loop = loop_over(model)
        together = await open_replies(model, loop, said)
        await speak_in(loop, together, groups)
        await loop.stop()
        for reply, alone in zip(together, solo, strict=True):
            assert len(reply.codes) == len(alone.codes) > 1
            assert torch.equal(torch.cat(reply.codes), torch.cat(alone.codes))


async def test_openings_that_fit_a_graph_replay_it_and_give_the_solo_codes(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply]
) -> None:
    """A step of prefills (the replies' openings, opened together) whose positions fit
    the largest graph runs each position as a row of a replayed graph: every session's
    frames are still its solo eager frames; past the largest graph, in pieces of its rows
    (up to ``ROWS_PIECES``); past that, the prefill forward."""
    path = cache_dir / "tiny-omni" / "seed-0"
    captures = Captures()
    common: dict[str, Any] = {"stop_at_codec_eos": True, "max_context": 512}
    graphed = TalkerModel(path, **common, slots=64, max_rows=64, graphs=True, capture=captures)
    for group in ([0], [1], [2], [0, 2]):  # alone, then two openings in one step
        loop = loop_over(graphed)
        before = captures.replays
        replies = await open_replies(graphed, loop, [said[n] for n in group])
        assert captures.replays > before  # the opening step replayed a graph
        await speak_in(loop, replies, [list(range(len(replies)))])
        await loop.stop()
        for reply, n in zip(replies, group, strict=True):
            assert torch.equal(torch.cat(reply.codes), torch.cat(solo[n].codes))
    # An opening of more positions than the largest graph's rows: replayed in pieces of
    # max_rows positions, in order, up to ROWS_PIECES of them; past that, the prefill
    # forward.
    got = reply_input(said[0])
    rows, _ = got.take_user()
    positions = rows.shape[0] + 9  # the user rows and the assistant prefix
    for pieces in (3, ROWS_PIECES):
        max_rows = -(-positions // pieces)
        assert -(-positions // max_rows) == pieces
        model = TalkerModel(
            path, **common, slots=max_rows, max_rows=max_rows, graphs=True, capture=captures
        )
        loop = loop_over(model)
        before = captures.replays
        (reply,) = await open_replies(model, loop, [said[0]])
        assert captures.replays - before == pieces
        await speak_in(loop, [reply], [[0]])
        await loop.stop()
        assert torch.equal(torch.cat(reply.codes), torch.cat(solo[0].codes))
    max_rows = -(-positions // (ROWS_PIECES + 1))
    small = TalkerModel(
        path, **common, slots=max_rows, max_rows=max_rows, graphs=True, capture=captures
    )
    loop = loop_over(small)
    before = captures.replays
    (reply,) = await open_replies(small, loop, [said[0]])
    assert captures.replays == before  # more pieces than ROWS_PIECES: the prefill forward
    await loop.stop()
    assert torch.equal(reply.codes[0], solo[0].codes[0])


async def test_fresh_prefills_replay_a_prefill_graph_and_give_the_solo_codes(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply]
) -> None:
    """With ``prefill_graphs``, a request's chunks from the start of its slot (here a
    reply's whole opening: its user rows and the assistant prefix) replay the fresh
    prefill graph of their length bucket (padded at the end): alone, several in one
    step, chunked (the first chunk replays, the rest runs as before) and beside other
    sessions' frames, every session's frames are its solo eager frames; a graph that
    differs from eager leaves its length eager, counted."""
    path = cache_dir / "tiny-omni" / "seed-0"
    common: dict[str, Any] = {"stop_at_codec_eos": True, "slots": 4, "max_context": 512}
    fresh: dict[str, Any] = {"graphs": True, "prefill_graphs": True, "prefill_bucket": 32}
    captures = Captures()
    graphed = TalkerModel(path, **common, capture=captures, **fresh)
    assert graphed.prefill_sizes() == list(range(32, 513, 32))

    def replays() -> dict[int, int]:
        # The fresh prefill graphs: one output, the backbone's states of 32 rows or more.
        graphs = [g for g in captures.graphs if g.outputs[0].shape[0] >= 32]
        return {g.outputs[0].shape[0]: g.replays for g in graphs}

    def same(replies: list[SteppedReply], indices: Iterable[int]) -> None:
        for reply, n in zip(replies, indices, strict=True):
            assert len(reply.codes) == len(solo[n].codes) > 1
            assert torch.equal(torch.cat(reply.codes), torch.cat(solo[n].codes))

    lengths = []
    for n, outputs in enumerate(said):  # alone
        loop = loop_over(graphed)
        (reply,) = await open_replies(graphed, loop, [outputs])
        lengths.append(reply.request.computed)
        await speak_in(loop, [reply], [[0]])
        await loop.stop()
        same([reply], [n])
    buckets = sorted({-(-length // 32) * 32 for length in lengths})
    assert graphed.prefill_graphed == [(1, size) for size in buckets]
    assert set(replays()) == set(buckets)
    # Several in one step, then a prompt in chunks: its first chunk replays.
    loop = loop_over(graphed)
    together = await open_replies(graphed, loop, said)
    await speak_in(loop, together, [[0, 1, 2]])
    await loop.stop()
    same(together, range(3))
    assert loop.statistics().largest_step == 3
    before = replays()
    loop = Loop(
        graphed_step(graphed), slots=4, max_context=512, max_tokens_per_step=24, max_chunk=20
    )
    loop.start()
    (chunked,) = await open_replies(graphed, loop, [said[0]])
    await speak_in(loop, [chunked], [[0]])
    await loop.stop()
    same([chunked], [0])
    assert replays()[32] == before.get(32, 0) + 1  # the first chunk alone
    # An opening beside other sessions' frames, in one step.
    loop = loop_over(graphed)
    first = await open_replies(graphed, loop, said[:2])
    live = [(reply, feed) for reply in first if (feed := reply.feed()) is not None]
    frames = [loop.submit(reply.request, feed, 1, decode=True) for reply, feed in live]
    got = reply_input(said[2])
    rows, mask = got.take_user()
    assert got.opening is not None
    assert got.tts is not None
    speaker = graphed.speakers["chelsie"]
    opening = graphed.opening_inputs(rows, mask, got.opening, got.tts, got.embeds[0], speaker)
    late = SteppedReply(got, loop.open("late"), None, [])
    opened = loop.submit(late.request, TalkerFeed(opening, frame=True), len(opening))
    for (reply, _), future in zip(live, frames, strict=True):
        reply.take((await future)[0])
    late.take((await opened)[-1])
    await speak_in(loop, [*first, late], [[0, 1, 2]])
    await loop.stop()
    assert loop.statistics().mixed_steps > 0
    same([*first, late], range(3))
    assert graphed.eager_steps == 0

    differs = TalkerModel(path, **common, capture=Differs(), **fresh)
    loop = loop_over(differs)
    (reply,) = await open_replies(differs, loop, [said[0]])
    await speak_in(loop, [reply], [[0]])
    await loop.stop()
    same([reply], [0])
    assert differs.prefill_graphed == []
    assert (differs.eager_steps or 0) >= 1


async def test_fresh_prefill_graphs_are_captured_at_load(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply]
) -> None:
    """Warm, every fresh prefill length is captured at load, and an opening captures
    nothing more."""
    captures = Captures()
    graphed = TalkerModel(
        cache_dir / "tiny-omni" / "seed-0",
        stop_at_codec_eos=True,
        slots=2,
        max_context=256,
        graphs=True,
        warm=True,
        capture=captures,
        prefill_graphs=True,
        prefill_bucket=128,
    )
    assert graphed.prefill_graphed == [(1, 128), (1, 256)]
    captured = len(captures.graphs)
    loop = loop_over(graphed)
    (reply,) = await open_replies(graphed, loop, [said[1]])
    await speak_in(loop, [reply], [[0]])
    await loop.stop()
    assert len(captures.graphs) == captured
    assert torch.equal(torch.cat(reply.codes), torch.cat(solo[1].codes))


def test_the_talker_replays_fresh_prefill_graphs_on_a_gpu_by_default(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On by default where steps replay graphs, as the thinker's: the engine's loop then
    keeps first prompts whole; turned off, or on the CPU, nothing replays."""
    assert TalkerArgs().prefill_graphs_on(torch.device("cuda", 0))
    assert not TalkerArgs(prefill_graphs=False).prefill_graphs_on(torch.device("cuda", 0))
    assert not TalkerArgs(static_cache=False).prefill_graphs_on(torch.device("cuda", 0))
    assert not TalkerArgs().prefill_graphs_on(torch.device("cpu"))
    monkeypatch.setattr(talker_engine, "release_dir", lambda *_: cache_dir)
    monkeypatch.setattr(torch_engine, "resolve_device", lambda _: torch.device("cuda", 0))
    assert TalkerEngine(TalkerArgs(device="cuda")).loop.whole_fresh_prefills is True
    off = TalkerArgs(device="cuda", prefill_graphs=False)
    assert TalkerEngine(off).loop.whole_fresh_prefills is False


def graphed_step(model: TalkerModel) -> Any:
    async def execute(chunks: list[TalkerChunk]) -> list[Framed | None]:
        return model.step(chunks)

    return execute


async def test_warm_captures_the_rows_graphs_so_an_opening_captures_nothing(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply]
) -> None:
    """``warm`` captures a rows graph for every (row bucket, span) with the frame graphs,
    at load: a reply's opening then replays one, captures none, and gives the solo
    codes."""
    path = cache_dir / "tiny-omni" / "seed-0"
    captures = Captures()
    graphed = TalkerModel(
        path,
        stop_at_codec_eos=True,
        max_context=512,
        slots=64,
        max_rows=64,
        graphs=True,
        warm=True,
        capture=captures,
    )
    assert graphed._rows_graphs is not None
    assert sorted(graphed._rows_graphs.graphed) == graphed.frame_keys() == graphed.graphed
    captured, before = len(captures.graphs), captures.replays
    loop = loop_over(graphed)
    (reply,) = await open_replies(graphed, loop, [said[1]])
    assert captures.replays > before  # the opening replayed a rows graph
    await speak_in(loop, [reply], [[0]])
    await loop.stop()
    assert len(captures.graphs) == captured
    assert torch.equal(torch.cat(reply.codes), torch.cat(solo[1].codes))


def frame_chunks(model: TalkerModel, rows: int) -> list[TalkerChunk]:
    """A frame-only step of ``rows`` sessions (slots 0 ..), each at position 0."""
    loop = asyncio.get_running_loop()
    width = int(model.text_config.hidden_size)
    text = int(model.talker.config.thinker_hidden_size)
    gen = torch.Generator().manual_seed(rows)
    return [
        Chunk(
            Request(f"s{slot}", slot),
            Work(
                TalkerFeed(
                    carry=torch.randn(1, 1, width, generator=gen),
                    text=torch.randn(1, text, generator=gen),
                    frame=True,
                ),
                1,
                True,
                loop.create_future(),
            ),
            offset=0,
            length=1,
            start=0,
        )
        for slot in range(rows)
    ]


async def test_frame_steps_run_eager_for_want_of_a_graph_are_counted(cache_dir: Path) -> None:
    """A frame-only step with more rows than ``max_rows`` runs eager and counts; a
    replay, or a step run eager on purpose, does not; a model without graphs counts
    nothing (None)."""
    path = cache_dir / "tiny-omni" / "seed-0"
    graphed = TalkerModel(
        path,
        stop_at_codec_eos=True,
        slots=4,
        max_context=256,
        max_rows=2,
        graphs=True,
        warm=True,
        capture=Captures(),
    )
    assert graphed.eager_steps == 0
    graphed.step(frame_chunks(graphed, 2))
    graphed.step(frame_chunks(graphed, 1))
    graphed.step(frame_chunks(graphed, 3), eager=True)
    assert graphed.eager_steps == 0
    graphed.step(frame_chunks(graphed, 3))
    assert graphed.eager_steps == 1
    plain = TalkerModel(path, stop_at_codec_eos=True, slots=4, max_context=256)
    plain.step(frame_chunks(plain, 3))
    assert plain.eager_steps is None


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("fused", [False, True], ids=["apart", "fused"])
def test_compiled_static_frames_give_the_uncompiled_codes(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply], fused: bool
) -> None:
    """The frame-only step with its backbone layers and code-predictor steps compiled
    (the predictor's projections apart or fused) gives each session its solo codes,
    stepped two then one (so the batch changes). Every backbone layer runs one shared
    compiled graph: graphs are compiled per shape, never per layer."""
    path = cache_dir / "tiny-omni" / "seed-0"
    layers, predictor = Backend(), Backend()
    static = TalkerModel(
        path,
        stop_at_codec_eos=True,
        slots=3,
        frame_compile=FrameCompile(layers, predictor=False),
    )
    static._predictor = CompiledCodePredictor(static.talker, predictor, fused=fused)

    async def run() -> list[SteppedReply]:
        loop = loop_over(static)
        replies = await open_replies(static, loop, said)
        await speak_in(loop, replies, [[0, 1], [2]])
        await loop.stop()
        return replies

    together = asyncio.run(run())
    for reply, alone in zip(together, solo, strict=True):
        assert torch.equal(torch.cat(reply.codes), torch.cat(alone.codes))
    assert static.compiled == {"layers": "compiled", "code_predictor": "compiled"}
    assert 2 <= len(layers.graphs) == len(set(layers.graphs)) < 2 * len(static.talker.model.layers)
    # The predictor's batch goes 2, 1, 2, ...: a size-1 batch is specialised apart from
    # the dynamic one, so one shape may compile twice; never once per frame.
    assert 2 <= len(set(predictor.graphs)) <= len(predictor.graphs) <= 3


@pytest.mark.usefixtures("fresh_compiles")
def test_prefills_through_compiled_layers_give_the_uncompiled_codes(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply]
) -> None:
    """The backbone's prefill forwards (three sessions' openings in one step) through
    layers compiled at load for any length and layout give each session its solo
    codes; serving compiles nothing more."""
    path = cache_dir / "tiny-omni" / "seed-0"
    backend = Backend()
    model = TalkerModel(path, stop_at_codec_eos=True, slots=3, compile_prefill=backend)
    assert model.prefill_compiled == "compiled"
    at_load, runs = list(backend.graphs), backend.runs
    assert at_load

    async def run() -> list[SteppedReply]:
        loop = loop_over(model)
        replies = await open_replies(model, loop, said)
        await speak_in(loop, replies, [[0, 1], [2]])
        await loop.stop()
        return replies

    together = asyncio.run(run())
    for reply, alone in zip(together, solo, strict=True):
        assert torch.equal(torch.cat(reply.codes), torch.cat(alone.codes))
    assert backend.runs > runs
    assert backend.graphs == at_load


@pytest.mark.usefixtures("fresh_compiles")
def test_a_compile_that_fails_logs_once_and_runs_uncompiled(
    cache_dir: Path,
    said: list[list[Fields]],
    solo: list[SteppedReply],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = cache_dir / "tiny-omni" / "seed-0"
    static = TalkerModel(
        path, stop_at_codec_eos=True, slots=3, frame_compile=FrameCompile(Backend(fail=True))
    )

    async def run() -> list[SteppedReply]:
        loop = loop_over(static)
        replies = await open_replies(static, loop, said)
        await speak_in(loop, replies, [[0, 1, 2]])
        await loop.stop()
        return replies

    with caplog.at_level(logging.WARNING, "omni_actors.actors.engines.qwen3_omni.frame_compile"):
        together = asyncio.run(run())
    for reply, alone in zip(together, solo, strict=True):
        assert torch.equal(torch.cat(reply.codes), torch.cat(alone.codes))
    failed = "failed: BackendCompilerFailed: RuntimeError: no C++ compiler found"
    assert static.compiled == {"layers": failed, "code_predictor": failed}
    logged = [r.getMessage() for r in caplog.records if r.name.endswith(".frame_compile")]
    assert sorted(logged) == [
        f"talker {region}: torch.compile failed ({failed[8:]}); runs uncompiled"
        for region in ("code predictor", "layers")
    ]


@pytest.mark.usefixtures("fresh_compiles")
async def test_an_engine_speaks_as_each_session_alone_and_again_on_the_same_voice(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """Through the engine: three sessions' replies, then a second reply of each on the
    same voice (its slot's length moved back to its user parts, dropping the first
    reply's frames), give the codes each gives alone; so does the engine with its frame
    step compiled."""

    async def speak(**extra: Any) -> list[torch.Tensor]:
        async with talker(cache_dir, max_batch=2, **extra) as engine:
            got = []
            for _ in range(2):
                got += await asyncio.wait_for(
                    asyncio.gather(*(frames(engine, f"s{i}", o) for i, o in enumerate(said))),
                    120.0,
                )
            assert engine.loop.statistics().largest_step > 1
            if extra.get("compile_frame"):
                compiled = {"layers": "compiled", "code_predictor": "compiled"}
                assert engine._model.compiled == compiled
        return got

    async def alone() -> list[torch.Tensor]:
        async with talker(cache_dir) as engine:
            got = []
            for _ in range(2):
                got += [await frames(engine, f"s{i}", o) for i, o in enumerate(said)]
        return got

    eager = await alone()
    for got, want in zip(await speak(), eager, strict=True):
        assert torch.equal(got, want)
    # Its frame step compiled (aot_eager: no compiler needed), as on a GPU by default.
    compiled = await speak(compile_frame=True, compile_backend="aot_eager")
    for got, want in zip(compiled, eager, strict=True):
        assert torch.equal(got, want)


@pytest.mark.usefixtures("fresh_compiles")
def test_every_frame_key_compiles_past_dynamo_s_default_limit(cache_dir: Path) -> None:
    """Each (row bucket, span) of the frame-only step may compile its own graph of the
    backbone layer: the region's own limit holds them all, where dynamo's (8 by default,
    2 here) would run the later keys' layers uncompiled without failing."""
    path = cache_dir / "tiny-omni" / "seed-0"
    layers = Backend()
    model = TalkerModel(
        path,
        stop_at_codec_eos=True,
        slots=9,
        max_context=512,
        frame_compile=FrameCompile(layers, predictor=False),
    )
    keys = model.frame_keys()
    assert len({rows for rows, _ in keys}) > 2
    assert len({span for _, span in keys}) > 1
    default = torch._dynamo.config.recompile_limit
    # dynamo's own patch, not monkeypatch: undoing a setattr on its config module
    # deletes the setting, and every later compile in the process then fails.
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=2):
        for key in keys:
            model._frame_step(key[1], *model._static_inputs(key))
    assert torch._dynamo.config.recompile_limit == default
    assert len(layers.graphs) > 2
    assert model.compiled["layers"] == "compiled"


@pytest.mark.parametrize(
    ("compiles", "compiled"),
    [
        ({"compile_frame": True}, True),
        ({"compile_frame": False, "compile_prefill": True}, True),
        ({"compile_frame": False}, False),
    ],
    ids=["frame", "prefill", "none"],
)
async def test_a_talker_that_compiled_ends_the_compile_workers_when_it_stops(
    cache_dir: Path, compiles: dict[str, bool], compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor's compile workers are subprocesses it keeps for the process's life: the
    talker that compiled ends them as it stops (one that did not leaves them alone)."""
    ended: list[bool] = []
    monkeypatch.setattr(talker_engine, "end_compile_workers", lambda: ended.append(True))
    async with talker(cache_dir, **compiles, compile_backend="aot_eager"):
        assert ended == []
    assert ended == ([True] if compiled else [])


class AtHand:
    """A stage's input as an engine sees it once every chunk has come: each read returns
    at once, and it says so (``at_hand``)."""

    def __init__(self, chunks: list[Fields], *, says: bool) -> None:
        self._chunks = iter(chunks)
        self.at_hand = says

    def __aiter__(self) -> AtHand:
        return self

    async def __anext__(self) -> Fields:
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None


async def routed_frames(engine: TalkerEngine, session: str, inputs: AtHand) -> int:
    """Frames of a reply whose every output takes three turns of the event loop to go
    out, as a stage's routing may (a copy to the host)."""
    count = 0
    async for _ in engine.generate(session, inputs):
        count += 1
        for _ in range(3):
            await asyncio.sleep(0)
    return count


@pytest.mark.parametrize("says", [True, False])
async def test_sessions_with_their_next_token_at_hand_make_every_frame_step(
    cache_dir: Path, said: list[list[Fields]], says: bool
) -> None:
    """A session whose next frame needs a token that already arrived reads it and queues
    that frame before it hands out the frame it has (a buffered input is read without a
    turn of the event loop), so the step loop's next step has it however long each frame
    takes to go out: three such sessions beside one whose frames go out at once make
    every frame step together. From an input that cannot say it is at hand, the token is
    read after each output, and those three miss a step while each frame goes out."""
    outputs = edge(said[1])
    async with talker(cache_dir) as engine:
        counts = await asyncio.wait_for(
            asyncio.gather(
                frames(engine, "pacer", said[1]),
                *(routed_frames(engine, f"s{i}", AtHand(outputs, says=says)) for i in range(3)),
            ),
            60.0,
        )
        stats = engine.loop.statistics()
    pacer, *routed = counts
    rows = len(pacer) - 1 + sum(count - 1 for count in routed)  # frame 0: the opening's
    assert stats.decode_rows == rows
    per_step = rows / (stats.steps - stats.prefill_steps)
    if says:
        assert per_step > 3.5, per_step
    else:
        assert per_step < 3, per_step


class StepEvent:
    """Stands in for the CUDA event after a frame-only step: complete once a later step
    has run (the device computed the frame while the host queued the next one), else
    at a deadline, which a host that waits for each frame before queuing the next hits.
    ``seen``: the host has found it complete."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.overlapped = False
        self.seen = False

    def release(self) -> None:
        with self._lock:
            if not self._done.is_set():
                self.overlapped = True
                self._done.set()

    def query(self) -> bool:
        self.seen = self.seen or self._done.is_set()
        return self.seen

    def synchronize(self) -> None:
        if not self._done.wait(timeout=0.5):
            with self._lock:
                self._done.set()  # past its deadline: a later step no longer counts
        self.seen = True


def with_events(step: Any, events: list[StepEvent], bounded: list[bool]) -> Any:
    """``step`` with a :class:`StepEvent` as each frame-only step's ``ready``; each
    frame-only step adds to ``bounded`` whether the host had seen the step two before
    it complete (the device's queue then held at most the step it ran and this one)."""

    def stepping(chunks: list[TalkerChunk], **kwargs: Any) -> Any:
        for event in events:
            event.release()
        frames = all(chunk.work.decode for chunk in chunks)
        if frames:
            bounded.append(len(events) < 2 or events[-2].seen)
        out = step(chunks, **kwargs)
        if not frames:
            return out
        events.append(event := StepEvent())
        return [replace(framed, ready=event) for framed in out]

    return stepping


async def test_a_session_queues_its_next_frame_before_its_last_is_read_back(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """A frame step returns before the device has run it; the session queues its next
    frame before it waits for the last one's step (and codec EOS flag), so the device
    is never idle between a session's frames while the host hands one out; and it
    waits for that step, EOS masked or not, before it queues another, so the device's
    queue holds one frame ahead, not the reply."""

    async def spoken(engine: TalkerEngine, session: str) -> torch.Tensor:
        inputs = AtHand(edge(said[2]), says=True)  # each token there when it is needed
        got = [out["codes"] async for out in engine.generate(session, inputs)]
        return torch.cat([codes for codes in got if isinstance(codes, torch.Tensor)])

    async with talker(cache_dir) as engine:
        alone = await spoken(engine, "plain")
        events: list[StepEvent] = []
        bounded: list[bool] = []
        with pytest.MonkeyPatch.context() as patch:
            stepping = with_events(engine._model.step, events, bounded)
            patch.setattr(engine._model, "step", stepping)
            codes = await asyncio.wait_for(spoken(engine, "s"), 60.0)
    assert torch.equal(codes, alone)
    assert len(events) == len(codes) - 1  # every frame after the opening's
    assert all(event.overlapped for event in events[:-1])  # the last has no next frame
    assert len(bounded) == len(events)
    assert all(bounded)


class QueuedEvent:
    """Stands in for the CUDA event after a frame-only step on a device that runs its
    steps in order, each ``seconds`` long: complete that long after the step was queued
    or the one before it completed, whichever is later."""

    def __init__(self, after: QueuedEvent | None, seconds: float) -> None:
        start = time.monotonic() if after is None else max(time.monotonic(), after.at)
        self.at = start + seconds

    def query(self) -> bool:
        return time.monotonic() >= self.at

    def synchronize(self) -> None:
        threading.Event().wait(max(0.0, self.at - time.monotonic()))


def on_a_device(step: Any, seconds: float) -> Any:
    """``step`` with each frame-only step's ``ready`` a :class:`QueuedEvent`."""
    last: list[QueuedEvent] = []

    def stepping(chunks: list[TalkerChunk], **kwargs: Any) -> Any:
        out = step(chunks, **kwargs)
        if not all(chunk.work.decode for chunk in chunks):
            return out
        last[:] = [QueuedEvent(last[0] if last else None, seconds)]
        return [replace(framed, ready=last[0]) for framed in out]

    return stepping


async def test_sessions_whose_frame_steps_return_before_the_device_share_every_step(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """Frame steps that return before the device has run them do not split the
    sessions: each step returns once the device has run the one before it, and a session
    queues its next frame as that step returns, before the frame it hands out goes out
    (three turns of the event loop here), so every session's frame is in the next step.
    A loop that went on as soon as a step was queued ran whoever had queued by then: a
    step for every session or two."""
    outputs = edge(said[1])
    async with talker(cache_dir) as engine:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(engine._model, "step", on_a_device(engine._model.step, 0.02))
            counts = await asyncio.wait_for(
                asyncio.gather(
                    *(routed_frames(engine, f"s{i}", AtHand(outputs, says=True)) for i in range(4))
                ),
                60.0,
            )
        stats = engine.loop.statistics()
    rows = sum(count - 1 for count in counts)  # frame 0: the opening's
    assert stats.decode_rows == rows
    per_step = rows / (stats.steps - stats.prefill_steps)
    assert per_step > 3.8, per_step


async def test_a_frame_queued_past_codec_eos_is_dropped_with_the_reply(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """With its tokens at hand a session queues its next frame before the last one is
    known not to be codec EOS. At EOS that frame is dropped with the reply's part of the
    slot: the session's next reply is the one it makes after a reply of the same frames
    that ended at ``max_frames``, where no frame is queued past the last."""

    async def conversation(**extra: Any) -> tuple[list[torch.Tensor], int]:
        async with talker(cache_dir, **extra) as engine:
            queued = 0
            queue = engine._frame

            def counted(*args: Any) -> Any:
                nonlocal queued
                queued += 1
                return queue(*args)

            replies = []
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(engine, "_frame", counted)
                for outputs in (said[1], said[0]):  # the first reply ends at codec EOS
                    inputs = AtHand(edge(outputs), says=True)
                    got = [out["codes"] async for out in engine.generate("s", inputs)]
                    replies.append(torch.cat([c for c in got if isinstance(c, torch.Tensor)]))
        return replies, queued

    ahead, queued = await asyncio.wait_for(conversation(stop_at_codec_eos=True), 60.0)
    spoken = ahead[0].shape[0]
    assert spoken < 2 * tokens(said[1])  # ended at codec EOS
    # Every frame after the openings' was queued, and one past the first reply's EOS.
    assert queued == spoken + ahead[1].shape[0]
    capped, _ = await asyncio.wait_for(conversation(max_frames=spoken), 60.0)
    assert torch.equal(capped[0], ahead[0])
    assert torch.equal(capped[1], ahead[1][: capped[1].shape[0]])


class HeldEvent:
    """Stands in for a frame step's CUDA event that completes when the test says (or at
    a deadline); ``waited`` is set once something waits for it."""

    def __init__(self, done: threading.Event, waited: threading.Event) -> None:
        self._done = done
        self._waited = waited

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._waited.set()
        self._done.wait(timeout=10.0)


async def test_a_frame_whose_step_completes_after_an_abort_is_not_handed_out(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """A session waiting for its last frame's step when it is aborted ends there: that
    frame does not go out, nor does the one queued behind it."""
    done, waited = threading.Event(), threading.Event()
    async with talker(cache_dir) as engine:
        step = engine._model.step

        def held(chunks: list[TalkerChunk], **kwargs: Any) -> Any:
            out = step(chunks, **kwargs)
            if not all(chunk.work.decode for chunk in chunks):
                return out
            return [replace(framed, ready=HeldEvent(done, waited)) for framed in out]

        got: list[Fields] = []

        async def speak() -> None:
            async for out in engine.generate("s", AtHand(edge(said[2]), says=True)):
                got.append(out)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(engine._model, "step", held)
            task = asyncio.create_task(speak())
            await eventually(waited.is_set, what="a wait for a frame step")
            assert len(got) == 1  # the opening's frame
            await engine.abort("s")
            done.set()
            await asyncio.wait_for(task, 10.0)
        assert len(got) == 1
        assert engine.generating == set()


async def test_a_reply_s_opening_goes_before_other_sessions_user_rows(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """The opening, whose frame is the reply's first audio, is queued urgent: it passes
    other sessions' user rows queued before it (the step loop's order); the user rows
    sent ahead of the first token are not."""
    async with talker(cache_dir) as engine:
        queued: list[tuple[int, bool, bool]] = []
        submit = engine.loop.submit

        def recorded(*args: Any, **kwargs: Any) -> Any:
            queued.append((args[2], kwargs.get("decode", False), kwargs.get("urgent", False)))
            return submit(*args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(engine.loop, "submit", recorded)
            codes = await frames(engine, "s", said[0])
    prefills = [(length, urgent) for length, decode, urgent in queued if not decode]
    # The user rows sent ahead of the first token, then the opening: the rows left and
    # the assistant prefix.
    assert [urgent for _, urgent in prefills] == [False, True]
    rows = reply_input(said[0]).take_user()[0].shape[0]
    assert sum(length for length, _ in prefills) == rows + PREFIX
    assert len(queued) == 2 + len(codes) - 1  # and a frame row per frame after the first
