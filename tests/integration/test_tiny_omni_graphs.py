"""tiny-omni's graphed steps around their graphs, on the CPU.

CUDA graphs cannot run here; a stand-in capture plays the graph (its replay runs the step
on the static inputs it was captured with). What is checked is everything around the
graphs: code2wav windows of a common shape run as the smallest batch bucket that holds
them, padded with copies whose output is dropped, and each row is what its window
decodes alone; other windows, batches above the largest bucket and failed captures run
eager with the same result; warm-up captures the buckets up to a batch size. The code
predictor gives stepping's frames through the same mechanism.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni import configs, stepping, weights
from omni_actors.actors.engines.qwen3_omni.code2wav_model import Code2WavModel, Piece
from omni_actors.actors.engines.qwen3_omni.code_predictor_graph import GraphedCodePredictor
from omni_actors.actors.engines.qwen3_omni.frame_compile import CompiledCodePredictor

pytestmark = pytest.mark.integration


class StandIn:
    """A graph of ``fn(*inputs)``: each replay recomputes it into the first outputs."""

    def __init__(self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> None:
        self.fn, self.inputs = fn, inputs
        self.outputs = fn(*inputs)

    def replay(self) -> None:
        fresh = self.fn(*self.inputs)
        if isinstance(fresh, torch.Tensor):
            self.outputs.copy_(fresh)
        else:
            for static, new in zip(self.outputs, fresh, strict=True):
                static.copy_(new)


class Captures:
    """Records the input shapes each capture was given; ``fail`` raises as an op that
    cannot be captured does."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> StandIn:
        self.shapes.append(tuple(inputs[0].shape))
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return StandIn(fn, inputs)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Compute on one thread, as the engines do: torch's default pool made these forwards
    ten times slower on a small machine that runs other tests meanwhile."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def stage_dir(cache_dir: Path) -> Path:
    return cache_dir / "tiny-omni" / "seed-0"


def random_windows(model: Code2WavModel, rows: int, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.codebook, (rows, model.quantizers, frames), generator=gen)


def alone(model: Code2WavModel, codes: torch.Tensor, start: int) -> list[Piece]:
    """Each window decoded by itself, eager: what a batch must give row by row."""
    return [model.decode(codes[i : i + 1], [start])[0] for i in range(codes.shape[0])]


def close(pieces: list[Piece], expected: list[Piece]) -> bool:
    """The same audio, up to the last bits a batch size changes in float sums."""
    return len(pieces) == len(expected) and all(
        a.shape == b.shape and float((a - b).abs().max()) < 1e-5
        for got, want in zip(pieces, expected, strict=True)
        for a, b in zip(got, want, strict=True)
    )


def same(pieces: list[Piece], expected: list[Piece]) -> bool:
    return len(pieces) == len(expected) and all(
        torch.equal(a, b)
        for got, want in zip(pieces, expected, strict=True)
        for a, b in zip(got, want, strict=True)
    )


# A steady window of 10 frames of context and 5 new ones: short, so the tests are quick.
FRAMES, CONTEXT = 15, 10


def test_common_windows_run_as_their_bucket_and_give_each_window_s_own_audio(
    stage_dir: Path,
) -> None:
    captures = Captures()
    model = Code2WavModel(stage_dir, buckets=(4, 1, 2), capture=captures)
    steady = model.start(CONTEXT)
    skip = CONTEXT - 1 - model.reach_frames  # the context the decoder blocks do not read
    codes = random_windows(model, 3, FRAMES, seed=1)
    expected = alone(model, codes, steady)
    padded = model.decode(torch.cat((codes, codes[-1:])), [steady] * 4)[:3]
    assert captures.shapes == []  # not common: eager

    batched = model.decode(codes, [steady] * 3, common=True)
    assert captures.shapes == [(4, model.quantizers, FRAMES)]  # padded to the bucket
    assert model.graphed == [(4, FRAMES, skip)]
    assert same(batched, padded)  # exactly the padded batch's rows, in order
    assert close(batched, expected)  # each row its own window's audio
    assert not close(batched[:1], expected[1:2])
    # Replayed on other windows of the shape: each row still its own window's audio.
    other = random_windows(model, 3, FRAMES, seed=2)
    assert close(model.decode(other, [steady] * 3, common=True), alone(model, other, steady))
    assert same(model.decode(other[:1], [steady], common=True), alone(model, other[:1], steady))
    assert model.graphed == [(4, FRAMES, skip), (1, FRAMES, skip)]
    # A first chunk (no context) is a shape of its own.
    first = random_windows(model, 2, 4, seed=3)
    assert close(model.decode(first, [0, 0], common=True), alone(model, first, 0))
    assert model.graphed[-1] == (2, 4, 0)
    assert len(captures.shapes) == 3


def test_batches_above_the_largest_bucket_and_failed_captures_run_eager(
    stage_dir: Path,
) -> None:
    captures = Captures()
    model = Code2WavModel(stage_dir, buckets=(1, 2), capture=captures)
    codes = random_windows(model, 3, 9, seed=4)
    start = model.start(4)
    expected = model.decode(codes, [start] * 3)
    assert model.eager_steps == 0  # a window that is not common is eager by design
    assert same(model.decode(codes, [start] * 3, common=True), expected)
    assert captures.shapes == []
    assert model.eager_steps == 1  # a common one with no bucket to hold it is a fallback

    failing = Captures(fail=True)
    model = Code2WavModel(stage_dir, buckets=(1, 2, 4), capture=failing)
    expected = model.decode(torch.cat((codes, codes[-1:])), [start] * 4)[:3]
    assert same(model.decode(codes, [start] * 3, common=True), expected)
    assert same(model.decode(codes, [start] * 3, common=True), expected)
    assert failing.shapes == [(4, model.quantizers, 9)]  # tried once, then eager
    assert model.graphed == []
    assert model.eager_steps == 2
    # Without buckets (the CPU, graphs off) there are no graphs to fall back from.
    assert Code2WavModel(stage_dir).eager_steps is None


def test_warm_captures_each_bucket_up_to_a_batch_size(stage_dir: Path) -> None:
    captures = Captures()
    model = Code2WavModel(stage_dir, buckets=(1, 2, 4), capture=captures)
    skip = CONTEXT - 1 - model.reach_frames
    model.warm(FRAMES, CONTEXT, rows=2)
    model.warm(4, 0, rows=1)
    assert model.graphed == [(1, FRAMES, skip), (2, FRAMES, skip), (1, 4, 0)]
    model.warm(4, 0, rows=100)  # above the largest bucket: all of them
    assert model.graphed[-2:] == [(2, 4, 0), (4, 4, 0)]
    count = len(captures.shapes)
    codes = random_windows(model, 2, FRAMES, seed=5)
    start = model.start(CONTEXT)
    expected = model.decode(codes, [start] * 2)
    assert same(model.decode(codes, [start] * 2, common=True), expected)
    assert len(captures.shapes) == count  # warmed: no capture while decoding
    assert model.eager_steps == 0  # replayed
    with pytest.raises(ValueError, match=r"left context must lie in \[0, 4\) frames, got 4"):
        model.warm(4, 4, rows=1)
    # Without buckets (the CPU, graphs off) warm-up does nothing.
    plain = Code2WavModel(stage_dir, capture=captures)
    plain.warm(FRAMES, CONTEXT, rows=4)
    assert plain.graphed == []
    assert len(captures.shapes) == count


def _gives_stepping_s_frames(
    talker: Any, graphed: GraphedCodePredictor, batches: tuple[int, ...], *, seed: int
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``graphed`` gives ``code_predictor_frame``'s codes and carry on random frames of
    each batch size in turn; the last frame's inputs and expected outputs."""
    width = int(talker.config.text_config.hidden_size)
    gen = torch.Generator().manual_seed(seed)
    for batch in batches:
        hidden = torch.randn(batch, 1, width, generator=gen)
        code0 = torch.randint(0, configs.CODEBOOK_SIZE, (batch, 1), generator=gen)
        codes, carry = graphed(hidden, code0)
        expected = stepping.code_predictor_frame(talker, hidden, code0)
        assert torch.equal(codes, expected[0]), batch
        assert torch.equal(carry, expected[1]), batch
    return hidden, code0, expected


def test_the_code_predictor_replays_stepping_s_frames(stage_dir: Path) -> None:
    talker = weights.load(stage_dir, "talker")
    captures = Captures()
    graphed = GraphedCodePredictor.of_talker(talker, capture=captures)
    graphed.warm(2)
    assert graphed.graphed == [2]
    hidden, code0, expected = _gives_stepping_s_frames(talker, graphed, (1, 3, 1, 2), seed=0)
    assert graphed.graphed == [1, 2, 3]
    assert [shape[0] for shape in captures.shapes] == [2, 1, 3]

    failing = GraphedCodePredictor.of_talker(talker, capture=Captures(fail=True))
    codes, _ = failing(hidden, code0)
    assert torch.equal(codes, expected[0])
    assert failing.graphed == []
    assert (graphed.eager_steps, failing.eager_steps) == (0, 1)


def test_the_code_predictor_runs_a_batch_as_its_bucket(stage_dir: Path) -> None:
    """With buckets, each batch replays its bucket's graph, padded with copies of its last
    row: the rows' own frames come back, and no batch size gets a graph of its own."""
    talker = weights.load(stage_dir, "talker")
    captures = Captures()
    graphed = GraphedCodePredictor.of_talker(talker, buckets=(1, 2, 4), capture=captures)
    for rows in (1, 2, 4):
        graphed.warm(rows)
    _gives_stepping_s_frames(talker, graphed, (3, 1, 4, 2, 3), seed=2)
    assert graphed.graphed == [1, 2, 4]
    assert [shape[0] for shape in captures.shapes] == [1, 2, 4]


@pytest.mark.parametrize("fused", [False, True], ids=["apart", "fused"])
def test_the_static_code_predictor_gives_stepping_s_frames(stage_dir: Path, fused: bool) -> None:
    """The code predictor over its buffer of one position per group (what is compiled),
    its projections apart or fused, gives ``code_predictor_frame``'s codes and carry."""
    talker = weights.load(stage_dir, "talker")
    predictor = CompiledCodePredictor(talker, "eager", fused=fused)
    width = int(talker.config.text_config.hidden_size)
    gen = torch.Generator().manual_seed(1)
    for batch in (1, 3, 2, 4) * 3:
        hidden = torch.randn(batch, 1, width, generator=gen)
        code0 = torch.randint(0, configs.CODEBOOK_SIZE, (batch, 1), generator=gen)
        codes, carry = predictor.frame(hidden, code0)
        expected = stepping.code_predictor_frame(talker, hidden, code0)
        assert torch.equal(codes, expected[0]), batch
        assert torch.equal(carry, expected[1]), batch
