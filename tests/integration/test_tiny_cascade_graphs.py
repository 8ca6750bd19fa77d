"""The synthesizer's graphed frames on tiny-cascade, on the CPU.

CUDA graphs cannot run here; the stand-in capture plays each graph (its replay runs the
step on the static inputs it was captured with). What is checked is everything around
the graphs: steps of frame rows alone replay one graph per (row bucket, span), captured
at load, and give CSM's own ``generate``'s frames; sessions batched into a bucket with a
padding row get their frames alone; a mixed step's depth decoder replays per row
bucket; a step of more rows than the largest graph runs eagerly; and nothing a graph
holds reads a tensor back to the host, which a CUDA capture would refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from graph_standins import Captures, StandIn

from omni_actors.actors.engines.cascade.tts_model import Speech, SpeechChunk, SpeechModel
from omni_actors.actors.engines.step_loop import StepLoop
from omni_actors.models.cache import prepare

pytestmark = pytest.mark.integration

FRAMES = 6
TEXTS = ("Hello there,", "A longer phrase to speak,", "Hi")


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare("tiny-cascade", cache_dir=tmp_path_factory.mktemp("weights"), seed=0) / "tts"


def _csm_codes(path: Path, text: str, frames: int) -> torch.Tensor:
    """HF's greedy frames [frames, codebooks] for ``text`` by speaker 0."""
    from transformers import AutoTokenizer, CsmForConditionalGeneration

    model = CsmForConditionalGeneration.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = [model.config.bos_token_id, *tokenizer.encode(f"[0]{text}", add_special_tokens=False)]
    ids.append(tokenizer.eos_token_id)
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=frames, do_sample=False, depth_decoder_do_sample=False
    )
    return out[0]


def _loop(model: SpeechModel, rows: int) -> StepLoop[Speech, torch.Tensor | None]:
    async def execute(chunks: list[SpeechChunk]) -> list[torch.Tensor | None]:
        return model.step(chunks)

    return StepLoop(
        execute,
        slots=model.cache.slots,
        max_context=model.cache.max_len,
        max_tokens_per_step=512,
        max_chunk=512,
        max_rows=rows,
    )


async def _speak(
    loop: StepLoop[Speech, torch.Tensor | None], model: SpeechModel, text: str
) -> torch.Tensor:
    """The text's first ``FRAMES`` frames, fed back one decode row each: [FRAMES, codebooks]."""
    request = loop.open(text)
    work = Speech(model.prompt(text, 0))
    frames = []
    for _ in range(FRAMES):
        outputs = await loop.submit(request, work, work.length, decode=work.length == 1)
        frame = outputs[-1]
        assert frame is not None
        frames.append(frame)
        work = Speech(frames=frame[None])
    loop.close(request)
    return torch.stack(frames)


async def _together(model: SpeechModel, rows: int) -> list[torch.Tensor]:
    """Every text spoken at once, sharing steps of up to ``rows`` rows."""
    loop = _loop(model, rows)
    loop.start()
    try:
        return list(await asyncio.gather(*(_speak(loop, model, text) for text in TEXTS)))
    finally:
        await loop.stop()


def _held(model: SpeechModel, slot: int, text: str) -> torch.Tensor:
    """The keys and values ``slot`` holds once ``text`` was spoken in it (its prompt and
    every frame fed back), of every layer."""
    length = len(model.prompt(text, 0)) + FRAMES - 1
    cache = model.cache
    return torch.stack([t[slot, :, :length] for t in (*cache.keys, *cache.values)])


def _rows(captures: Captures, inputs: int) -> dict[int, int]:
    """Replays per row count of the graphs of ``inputs`` inputs (3: frame steps, 2: the
    mixed steps' depth decoder)."""
    found: dict[int, int] = {}
    for graph in captures.graphs:
        if len(graph.inputs) == inputs:
            rows = int(graph.inputs[0].shape[0])
            found[rows] = found.get(rows, 0) + graph.replays
    return found


async def test_graphed_frames_are_csm_generate_and_batched_sessions_get_theirs(
    path: Path,
) -> None:
    captures = Captures()
    model = SpeechModel(
        path,
        torch.device("cpu"),
        slots=4,
        max_context=512,
        max_rows=4,
        graphs=True,
        warm=True,
        capture=captures,
    )
    # Every frame shape and depth bucket captured at load: none waits for a capture.
    assert model.graphed == model.frame_keys() == [(r, s) for r in (1, 2, 4) for s in (256, 512)]
    assert model.depth_graphed == [1, 2, 4]
    captured = len(captures.graphs)
    frames, depths = _rows(captures, 3), _rows(captures, 2)  # the checks' replays

    # A session alone speaks CSM's own frames through the graphs.
    loop = _loop(model, 4)
    loop.start()
    alone, held = [], []
    for text in TEXTS:  # one after the other, each in slot 0
        alone.append(await _speak(loop, model, text))
        held.append(_held(model, 0, text))
    await loop.stop()
    for text, frames_alone in zip(TEXTS, alone, strict=True):
        assert torch.equal(frames_alone, _csm_codes(path, text, FRAMES)), text
    replayed = _rows(captures, 3)[1] - frames[1]
    assert replayed == len(TEXTS) * (FRAMES - 1)  # every frame step

    # Three sessions at once: their frame steps run as the bucket of 4, one row of
    # padding (on the scratch slot), and their prefills' depth decoder as its bucket.
    together = await _together(model, 4)
    for slot, (text, mine, solo) in enumerate(zip(TEXTS, together, alone, strict=True)):
        assert torch.equal(mine, solo), text
        # Its slot holds what it held alone: the padding row wrote none of it.
        assert torch.allclose(_held(model, slot, text), held[slot], atol=1e-5), text
    assert _rows(captures, 3)[4] - frames[4] == FRAMES - 1
    assert _rows(captures, 2)[4] - depths[4] == 1  # the three prefills' step
    assert len(captures.graphs) == captured  # nothing captured while speaking
    assert model.eager_steps == 0  # every step replayed

    # And eager gives the same frames.
    eager = SpeechModel(path, torch.device("cpu"), slots=4, max_context=512)
    for text, mine, expected in zip(TEXTS, together, await _together(eager, 4), strict=True):
        assert torch.equal(mine, expected), text


async def test_a_step_past_the_largest_graph_runs_eagerly(path: Path) -> None:
    captures = Captures()
    model = SpeechModel(
        path,
        torch.device("cpu"),
        slots=4,
        max_context=256,
        max_rows=2,
        graphs=True,
        warm=True,
        capture=captures,
    )
    assert model.graphed == [(1, 256), (2, 256)]
    graphs = len(captures.graphs)
    # The loop runs three frame rows a step; the model's graphs hold two at most.
    together = await _together(model, 3)
    assert len(captures.graphs) == graphs  # no graph of three rows
    assert all(graph.replays == 1 for graph in captures.graphs)  # each capture's check
    assert model.eager_steps == FRAMES - 1 + 1  # every frame step, and the prefills' depth
    eager = SpeechModel(path, torch.device("cpu"), slots=4, max_context=256)
    assert eager.eager_steps is None  # no graphs: nothing to fall back from
    for text, mine, expected in zip(TEXTS, together, await _together(eager, 3), strict=True):
        assert torch.equal(mine, expected), text


def test_graphs_need_a_cuda_device_or_a_capture(path: Path) -> None:
    with pytest.raises(ValueError, match="graphs need a CUDA device"):
        SpeechModel(path, torch.device("cpu"), slots=1, max_context=256, graphs=True)


class HostReads(Captures):
    """A stand-in capture that records each read of a tensor's value by the host while
    the step it captures runs (a CUDA capture fails on such a read)."""

    READS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy")

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __call__(self, fn: Any, inputs: tuple[torch.Tensor, ...]) -> StandIn:
        with self._spying():
            return super().__call__(fn, inputs)

    @contextlib.contextmanager
    def _spying(self) -> Iterator[None]:
        saved = {name: getattr(torch.Tensor, name) for name in self.READS}

        def spy(name: str) -> Any:
            def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                self.reads.append(name)
                return saved[name](tensor, *args, **kwargs)

            return read

        for name in self.READS:
            setattr(torch.Tensor, name, spy(name))
        try:
            yield
        finally:
            for name, method in saved.items():
                setattr(torch.Tensor, name, method)


def test_the_captured_steps_read_nothing_back_to_the_host(path: Path) -> None:
    captures = HostReads()
    model = SpeechModel(
        path,
        torch.device("cpu"),
        slots=2,
        max_context=256,
        graphs=True,
        warm=True,
        capture=captures,
    )
    assert model.graphed == [(1, 256), (2, 256)]
    assert model.depth_graphed == [1, 2]
    assert captures.reads == []
