"""The talker steps the frames of concurrent sessions in shared forwards.

Two kinds of test, kept apart on purpose. Exactness is pinned where the batch is
deterministic: :class:`TalkerModel` driven directly, three sessions of different cache
lengths stepped in one padded batch, each frame compared with the same session stepped
alone. Through the engine, which sessions share a forward depends on timing, so those
tests assert structure only: frame counts, codes in range, forwards shared, bounded by
``max_batch``, failures confined to the sessions of the failed forward.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from tiny_omni_ids import (
    PRINTABLE_RANGES,
    TINY_TALKER,
)

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.qwen3_omni import configs
from omni_actors.actors.engines.qwen3_omni.frame_compile import (
    CompiledCodePredictor,
    FrameCompile,
)
from omni_actors.actors.engines.qwen3_omni.hf import DynamicCache
from omni_actors.actors.engines.qwen3_omni.static_decode import StaticPlan
from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs, TalkerEngine
from omni_actors.actors.engines.qwen3_omni.talker_input import ReplyInput
from omni_actors.actors.engines.qwen3_omni.talker_model import (
    Frame,
    FrameStep,
    Speech,
    TalkerModel,
    Voice,
)
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.models import cache as model_cache

pytestmark = pytest.mark.integration

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


# -- the padded batch, driven directly ---------------------------------------------------


@dataclass
class SteppedReply:
    """One session's reply being stepped by the test."""

    got: ReplyInput
    speech: Speech
    frame: Frame
    codes: list[torch.Tensor]

    def step(self) -> FrameStep | None:
        """The next frame's step, or None when the reply is over (EOS or all frames)."""
        if self.frame is None or len(self.codes) >= 2 * len(self.got.embeds):
            return None
        return FrameStep(self.speech, self.frame[1], self.got.text(len(self.codes)))

    def take(self, frame: Frame) -> None:
        self.frame = frame
        if frame is not None:
            self.codes.append(frame[0])


def open_reply(model: TalkerModel, outputs: list[Fields]) -> SteppedReply:
    got = reply_input(outputs)
    rows, mask = got.take_user()
    assert got.opening is not None
    assert got.tts is not None
    voice = Voice(DynamicCache(config=model.text_config))
    speaker = model.speakers["chelsie"]
    speech, frame = model.open(voice, rows, mask, got.opening, got.tts, got.embeds[0], speaker)
    reply = SteppedReply(got, speech, None, [])
    reply.take(frame)
    return reply


def speak(model: TalkerModel, replies: list[SteppedReply]) -> None:
    """Step ``replies`` to their ends, every live one in each model call."""
    while live := [(reply, step) for reply in replies if (step := reply.step()) is not None]:
        frames = model.frames([step for _, step in live])
        for (reply, _), frame in zip(live, frames, strict=True):
            reply.take(frame)


def test_a_padded_batch_gives_each_session_its_solo_codes(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """Sessions of different cache lengths (their user turns differ) stepped in one
    forward get the frames each gets alone, EOS where it comes alone included.

    Exact codes, though the batch changes float sums in the last bits (the talker's
    logits then differ from the solo run's by ~1e-7): with the seed-0 weights no pick on
    these replies is that close to a tie. Should another CPU's arithmetic flip one,
    compare the talker's logits within such a tolerance instead.
    """
    model = TalkerModel(cache_dir / "tiny-omni" / "seed-0", stop_at_codec_eos=True)
    alone = [open_reply(model, outputs) for outputs in said]
    for reply in alone:
        speak(model, [reply])
    together = [open_reply(model, outputs) for outputs in said]
    positions = {reply.speech.position for reply in together}
    assert len(positions) == len(said)  # three cache lengths: padding in play
    speak(model, together)
    # The second row picks codec EOS and leaves the batch; the others go on to their ends.
    ended = [len(reply.codes) < 2 * len(reply.got.embeds) for reply in alone]
    assert ended == [False, True, False]
    assert len(alone[1].codes) < max(len(alone[0].codes), len(alone[2].codes))
    for solo, batched in zip(alone, together, strict=True):
        assert torch.equal(torch.cat(batched.codes), torch.cat(solo.codes))


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
async def test_concurrent_sessions_share_forwards_up_to_max_batch(
    cache_dir: Path, said: list[list[Fields]], max_batch: int
) -> None:
    sessions = [said[i % len(said)] for i in range(6)]
    async with talker(cache_dir, max_batch=max_batch) as engine:
        replies = await asyncio.wait_for(
            asyncio.gather(*(frames(engine, f"s{i}", o) for i, o in enumerate(sessions))), 60.0
        )
        assert engine.generating == set()
        batcher = engine.batcher
    for outputs, codes in zip(sessions, replies, strict=True):
        assert codes.shape == (2 * tokens(outputs), configs.DEFAULT_NUM_CODE_GROUPS)
        assert int(codes.min()) >= 0
        assert int(codes.max()) < configs.CODEBOOK_SIZE
    # Frame 0 comes with each session's prefill; every later frame is a batcher step.
    assert batcher.requests == sum(len(codes) - 1 for codes in replies)
    assert 1 < batcher.largest <= max_batch
    assert batcher.calls < 0.75 * batcher.requests  # most forwards were shared


def fail_when_batched(layer: torch.nn.Module) -> Any:
    forward = layer.forward

    def failing(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if hidden.shape[0] > 1:
            raise RuntimeError("batched forward failed")
        return forward(hidden, *args, **kwargs)

    return failing


async def test_a_failed_batch_fails_its_sessions_alone_and_each_rolls_back(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """Sessions in a failed forward fail (their user turns rolled back); the engine
    serves the next responses, and a session stepping alone never failed."""
    async with talker(cache_dir) as engine:
        layer = engine._model.talker.model.layers[-1]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(layer, "forward", fail_when_batched(layer))
            outcomes = await asyncio.wait_for(
                asyncio.gather(
                    *(frames(engine, f"s{i}", o) for i, o in enumerate(said)),
                    return_exceptions=True,
                ),
                60.0,
            )
            assert engine.batcher.largest > 1
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


def speak_in(model: TalkerModel, replies: list[SteppedReply], groups: list[list[int]]) -> None:
    """Step the first ``STATIC_FRAMES`` frames of ``replies``, each round one model call
    per group of reply indices."""
    for _ in range(STATIC_FRAMES):
        for group in groups:
            live = [
                (reply, step)
                for reply in (replies[i] for i in group)
                if len(reply.codes) < STATIC_FRAMES and (step := reply.step()) is not None
            ]
            if live:
                frames = model.frames([step for _, step in live])
                for (reply, _), frame in zip(live, frames, strict=True):
                    reply.take(frame)


STATIC_FRAMES = 16


@pytest.fixture(scope="module")
def solo(cache_dir: Path, said: list[list[Fields]]) -> list[SteppedReply]:
    """Each session's first frames, stepped alone and eagerly."""
    eager = TalkerModel(cache_dir / "tiny-omni" / "seed-0", stop_at_codec_eos=True)
    replies = [open_reply(eager, outputs) for outputs in said]
    speak_in(eager, replies, [[0], [1], [2]])
    return replies


@pytest.mark.parametrize("case", ["room", "evict", "outgrow"])
def test_static_slot_frames_give_each_session_its_solo_codes(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply], case: str
) -> None:
    """Frames stepped over the static slot cache (eagerly on the CPU: the same steps a
    GPU replays from graphs) equal each session's solo eager frames: all three sessions
    in one step (``room``); two slots for three sessions, stepped two then one, so each
    step settles an idle session's slot and takes it, and that session comes back from
    its own cache (``evict``); a ``max_len`` the sessions outgrow mid-reply, after which
    they step eagerly over their own caches (``outgrow``)."""
    path = cache_dir / "tiny-omni" / "seed-0"
    opened = min(reply.speech.position - len(reply.codes) + 1 for reply in solo)
    slots, max_len = {"room": (4, 4096), "evict": (2, 4096), "outgrow": (4, opened + 8)}[case]
    static = TalkerModel(
        path, stop_at_codec_eos=True, static=StaticPlan(slots, max_len, graphs=False)
    )
    decoder = static.static
    assert decoder is not None
    together = [open_reply(static, outputs) for outputs in said]
    groups = {"room": [[0, 1, 2]], "evict": [[0, 1], [2]], "outgrow": [[0], [1], [2]]}
    speak_in(static, together, groups[case])
    assert decoder.steps > 0
    assert (decoder.fallbacks > 0) == (case == "outgrow")
    if case != "outgrow":  # stepped alone, the outgrowing sessions share row 0
        assert (decoder.evictions > 0) == (case == "evict")
    for reply, alone in zip(together, solo, strict=True):
        assert len(reply.codes) == len(alone.codes) > 1
        assert torch.equal(torch.cat(reply.codes), torch.cat(alone.codes))


class Backend:
    """A ``torch.compile`` backend: ``aot_eager`` (no compiler needed, the same ops), noting
    the input shapes of each graph it compiles; ``fail`` raises as a compile that fails."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.graphs: list[tuple[Any, ...]] = []

    def __call__(self, graph: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        if self.fail:
            raise RuntimeError("no C++ compiler found")
        self.graphs.append(tuple(str(x.shape) if torch.is_tensor(x) else str(x) for x in inputs))
        return torch._dynamo.lookup_backend("aot_eager")(graph, inputs)


@pytest.fixture
def fresh_compiles() -> Iterator[None]:
    """Compiled code and the sizes torch.compile saw made dynamic are process-wide: each
    test compiles from scratch, and leaves nothing for the next."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("fused", [False, True], ids=["apart", "fused"])
def test_compiled_static_frames_give_the_uncompiled_codes(
    cache_dir: Path, said: list[list[Fields]], solo: list[SteppedReply], fused: bool
) -> None:
    """The static frame step with its backbone layers and code-predictor steps compiled
    (the predictor's projections apart or fused) gives each session its solo codes,
    stepped two then one in two slots (so the batch changes, and slots are evicted).
    Every backbone layer runs one shared compiled graph: graphs are compiled per shape,
    never per layer."""
    path = cache_dir / "tiny-omni" / "seed-0"
    layers, predictor = Backend(), Backend()
    static = TalkerModel(
        path,
        stop_at_codec_eos=True,
        static=StaticPlan(2, 4096, graphs=False),
        frame_compile=FrameCompile(layers, predictor=False),
    )
    static._predictor = CompiledCodePredictor(static.talker, predictor, fused=fused)
    together = [open_reply(static, outputs) for outputs in said]
    speak_in(static, together, [[0, 1], [2]])
    for reply, alone in zip(together, solo, strict=True):
        assert torch.equal(torch.cat(reply.codes), torch.cat(alone.codes))
    assert static.compiled == {"layers": "compiled", "code_predictor": "compiled"}
    assert 2 <= len(layers.graphs) == len(set(layers.graphs)) < 2 * len(static.talker.model.layers)
    assert 2 <= len(predictor.graphs) == len(set(predictor.graphs))


@pytest.mark.usefixtures("fresh_compiles")
def test_a_compile_that_fails_logs_once_and_runs_uncompiled(
    cache_dir: Path,
    said: list[list[Fields]],
    solo: list[SteppedReply],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = cache_dir / "tiny-omni" / "seed-0"
    static = TalkerModel(
        path,
        stop_at_codec_eos=True,
        static=StaticPlan(4, 4096, graphs=False),
        frame_compile=FrameCompile(Backend(fail=True)),
    )
    together = [open_reply(static, outputs) for outputs in said]
    with caplog.at_level(logging.WARNING, "omni_actors.actors.engines.qwen3_omni.frame_compile"):
        speak_in(static, together, [[0, 1, 2]])
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
async def test_an_engine_over_the_static_cache_speaks_as_without_it(
    cache_dir: Path, said: list[list[Fields]]
) -> None:
    """Through the engine, with a static slot cache (forced on the CPU): three sessions'
    replies, then a second reply of each on the same voice (its crop drops the first
    reply's frames from the slot), give the codes they give without it."""

    async def speak(**extra: Any) -> list[torch.Tensor]:
        async with talker(cache_dir, max_batch=2, **extra) as engine:
            got = []
            for _ in range(2):
                got += await asyncio.wait_for(
                    asyncio.gather(*(frames(engine, f"s{i}", o) for i, o in enumerate(said))),
                    120.0,
                )
            static = engine._model.static
            if static is not None:
                assert static.steps > 0
            if extra.get("compile_frame"):
                compiled = {"layers": "compiled", "code_predictor": "compiled"}
                assert engine._model.compiled == compiled
        return got

    eager = await speak(static_cache=False)
    for got, want in zip(await speak(static_cache=True), eager, strict=True):
        assert torch.equal(got, want)
    # Its frame step compiled (aot_eager: no compiler needed), as on a GPU by default.
    compiled = await speak(static_cache=True, compile_frame=True, compile_backend="aot_eager")
    for got, want in zip(compiled, eager, strict=True):
        assert torch.equal(got, want)
