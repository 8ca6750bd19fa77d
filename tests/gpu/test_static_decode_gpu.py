"""Decode steps over the static slot cache replay from CUDA graphs, bit for bit what the
same steps compute eagerly, for the thinker and the talker, batches joining and leaving."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from omni_actors.actors.engines.qwen3_omni import weights
from omni_actors.actors.engines.qwen3_omni.sampling import Sampling
from omni_actors.actors.engines.qwen3_omni.static_decode import StaticPlan
from omni_actors.actors.engines.qwen3_omni.talker_model import (
    ROWS_PIECES,
    Framed,
    TalkerChunk,
    TalkerFeed,
    TalkerModel,
)
from omni_actors.actors.engines.qwen3_omni.thinker_model import (
    Fed,
    Feeding,
    Pick,
    ThinkerChunk,
    ThinkerModel,
)
from omni_actors.actors.engines.step_loop import StepLoop
from omni_actors.models.cache import prepare

DEVICE = torch.device("cuda", 0)
GREEDY = Sampling(1 << 20, 0, 0.0, None)
# Which sessions step together, round after round: batches grow, shrink and regroup,
# so rows join, leave, move down and are evicted.
ROUNDS = [[0], [0, 1, 2], [1, 2], [2], [0, 1, 2, 3, 4], [4], [3, 4], [0, 1, 2, 3, 4]] * 3


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare("tiny-omni", cache_dir=tmp_path_factory.mktemp("weights"))


@pytest.fixture
def release(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny release, loaded in bf16 as a real checkpoint is: the experts' grouped
    matmuls (what a graph can capture; float32 experts loop on the host) need it."""
    load = weights.load

    def bf16(*args: Any, **kwargs: Any) -> Any:
        return load(*args, **kwargs).to(torch.bfloat16)

    monkeypatch.setattr(weights, "load", bf16)
    return prepared


def thinker_tokens(model: ThinkerModel) -> list[list[int]]:
    """Five sessions prefilled together, then decoded in ``ROUNDS`` (rows join, leave
    and regroup), then each one more prefill: through a step loop, as the engine runs."""
    pick = Pick(True, GREEDY)

    async def execute(chunks: list[ThinkerChunk]) -> list[Fed]:
        return model.step(chunks)

    async def run() -> list[list[int]]:
        loop: StepLoop[Feeding, Fed] = StepLoop(
            execute, slots=5, max_context=512, max_tokens_per_step=512, max_chunk=64
        )
        loop.start()
        requests = [loop.open(f"s{n}") for n in range(5)]
        opened = [
            loop.submit(r, Feeding(list(range(40, 40 + 7 * (n + 1))), pick=pick), 7 * (n + 1))
            for n, r in enumerate(requests)
        ]
        tokens = [[(await f)[-1].token[0]] for f in opened]  # type: ignore[index]
        for group in ROUNDS:
            steps = [
                loop.submit(requests[i], Feeding([tokens[i][-1]], pick=pick), 1, decode=True)
                for i in group
            ]
            for i, step in zip(group, steps, strict=True):
                tokens[i].append((await step)[0].token[0])  # type: ignore[index]
        for i, request in enumerate(requests):
            fed = await loop.submit(request, Feeding([40, 41, 42], pick=pick), 3)
            tokens[i].append(fed[-1].token[0])  # type: ignore[index]
        await loop.stop()
        return tokens

    return asyncio.run(run())


def test_thinker_graphs_replay_the_eager_steps(release: Path) -> None:
    torch.cuda.set_device(DEVICE)
    graphed = ThinkerModel(release, DEVICE, slots=5, max_context=512, max_rows=4, graphs=True)
    eager = ThinkerModel(release, DEVICE, slots=5, max_context=512, max_rows=4)
    with torch.device(DEVICE):  # as the engine's model thread computes
        assert thinker_tokens(graphed) == thinker_tokens(eager)
    assert {rows for rows, _ in graphed.graphed} == {1, 2, 4}


def talker_codes(
    model: TalkerModel, stepped: list[Framed] | None = None
) -> list[list[torch.Tensor]]:
    """Five sessions opened, then frames in ``ROUNDS`` (rows join, leave and regroup);
    each frame step's output joins ``stepped``."""
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    width = int(model.talker.config.thinker_hidden_size)

    def rows(n: int) -> torch.Tensor:
        return torch.randn(n, width, device=DEVICE, generator=gen).to(torch.bfloat16)

    async def execute(chunks: list[TalkerChunk]) -> list[Framed | None]:
        return model.step(chunks)

    async def run() -> list[list[torch.Tensor]]:
        loop: StepLoop[TalkerFeed, Framed | None] = StepLoop(
            execute, slots=5, max_context=512, max_tokens_per_step=512, max_chunk=64
        )
        loop.start()
        speaker = next(iter(model.speakers.values()))
        requests, carries, codes = [], [], []
        for n in range(5):
            # Openings longer than ROWS_PIECES replays of the largest graph's rows: both
            # models run them as the prefill forward (a graphed model's shorter ones
            # replay the rows graphs, whose float sums differ from the forward's in the
            # last bits, and a near tie could then pick another code).
            users = ROWS_PIECES * 4 + 3 * (n + 1)
            mask = torch.zeros(users, dtype=torch.bool, device=DEVICE)
            inputs = model.opening_inputs(rows(users), mask, rows(3), rows(3), rows(1), speaker)
            request = loop.open(f"s{n}")
            (*_, first) = await loop.submit(request, TalkerFeed(inputs, frame=True), len(inputs))
            assert first is not None
            assert first.frame is not None
            requests.append(request)
            carries.append(first.frame[1])
            codes.append([first.frame[0]])
        for group in ROUNDS:
            text = rows(1)
            steps = [
                loop.submit(
                    requests[i], TalkerFeed(carry=carries[i], text=text, frame=True), 1, decode=True
                )
                for i in group
            ]
            for i, step in zip(group, steps, strict=True):
                (framed,) = await step
                assert framed is not None
                assert framed.frame is not None
                if stepped is not None:
                    stepped.append(framed)
                codes[i].append(framed.frame[0])
                carries[i] = framed.frame[1]
        await loop.stop()
        return codes

    return asyncio.run(run())


def test_talker_graphs_replay_the_eager_frames(release: Path) -> None:
    torch.cuda.set_device(DEVICE)
    graphed = TalkerModel(
        release, DEVICE, stop_at_codec_eos=False, slots=5, max_context=512, max_rows=4, graphs=True
    )
    eager = TalkerModel(release, DEVICE, stop_at_codec_eos=False, slots=5, max_context=512)
    with torch.device(DEVICE):
        pairs = list(zip(talker_codes(graphed), talker_codes(eager), strict=True))
    for got, want in pairs:
        assert torch.equal(torch.cat(got), torch.cat(want))
    assert {rows for rows, _ in graphed.graphed} == {1, 2, 4}


def test_talker_frame_steps_read_codec_eos_back_behind_the_step(release: Path) -> None:
    """A frame-only step returns each row's codec EOS flag as a copy to pinned host
    memory with the event recorded after it: once it completes, the flag is the frame's."""
    torch.cuda.set_device(DEVICE)
    model = TalkerModel(
        release, DEVICE, stop_at_codec_eos=True, slots=5, max_context=512, max_rows=4, graphs=True
    )
    stepped: list[Framed] = []
    with torch.device(DEVICE):
        talker_codes(model, stepped)
    assert len(stepped) == sum(len(group) for group in ROUNDS)
    for framed in stepped:
        assert isinstance(framed.ready, torch.cuda.Event)
        assert framed.eos is not None
        assert framed.eos.device.type == "cpu"
        assert framed.eos.is_pinned()
        assert framed.frame is not None
        framed.ready.synchronize()
        assert framed.at_eos() == (int(framed.frame[0][0, 0]) == model._codec_eos)


def test_engines_on_cuda_decode_over_graphed_slots_by_default(release: Path) -> None:
    torch.cuda.set_device(DEVICE)
    from omni_actors.actors.engines.qwen3_omni.static_decode import StaticDecodeArgs

    plan = StaticPlan.of(StaticDecodeArgs(), DEVICE, 16)
    assert plan == StaticPlan(16, 4096, graphs=True, warm=True)
