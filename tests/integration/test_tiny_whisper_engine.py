"""The ``transformers.asr`` engine on tiny-whisper: real (tiny, seeded) Whisper forwards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import torch

from omni_actors.actors.engines.asr.engine import AsrArgs, AsrEngine
from omni_actors.actors.engines.contract import Fields
from omni_actors.models.cache import is_prepared
from omni_actors.protocols.stage import SessionKey

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights")


async def _inputs(fields: Sequence[Fields]) -> AsyncIterator[Fields]:
    for item in fields:
        yield item


def _speech(seed: int, seconds: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(int(16000 * seconds), generator=generator) * 0.1


async def _transcribe(engine: AsrEngine, session: str, fields: Sequence[Fields]) -> list[Fields]:
    return [out async for out in engine.generate(SessionKey(session), _inputs(fields))]


async def test_one_transcript_per_turn_the_same_for_the_same_audio(cache: Path) -> None:
    assert not is_prepared("tiny-whisper", cache_dir=cache)
    engine = AsrEngine(AsrArgs(cache_dir=cache, max_transcript_tokens=12))
    assert is_prepared("tiny-whisper", cache_dir=cache)  # prepared on first use
    await engine.start()
    try:
        a, b = _speech(1), _speech(2)
        turns = [
            {"item": "first", "audio": a[:8000]},
            {"audio": a[8000:]},
            {"turn": "commit"},
            {"audio": b},
            {"turn": "clear"},  # dropped: no transcript
            {"item": "second", "audio": b},
        ]  # the segment's end commits the second turn
        outputs = await _transcribe(engine, "s#1", turns)
        ends = [o for o in outputs if "transcript" in o]
        assert [o["item"] for o in ends] == ["first", "second"]
        texts = [o["transcript"] for o in ends]
        assert all(isinstance(t, str) and t and t.isprintable() for t in texts)
        # Each turn's text streams token by token before it ends: the pieces join to it.
        for item, text in zip(["first", "second"], texts, strict=True):
            pieces = [
                str(o["transcript_delta"])
                for o in outputs
                if o["item"] == item and "transcript_delta" in o
            ]
            assert len(pieces) > 1
            assert "".join(pieces) == text
        assert outputs.index(ends[0]) < next(
            i for i, o in enumerate(outputs) if o["item"] == "second"
        )
        # Random weights, seeded: the same audio gives the same text, in any session.
        again = await _transcribe(engine, "s#2", [{"item": "x", "audio": a}])
        assert again[-1] == {"item": "x", "transcript": texts[0]}
        assert "".join(str(o["transcript_delta"]) for o in again[:-1]) == texts[0]
        await engine.release(SessionKey("s#1"))
        await engine.release(SessionKey("s#2"))
    finally:
        await engine.stop()


async def test_a_turn_that_fails_fails_alone(cache: Path) -> None:
    engine = AsrEngine(AsrArgs(cache_dir=cache, max_transcript_tokens=4))
    await engine.start()
    try:
        speech = _speech(3, 0.5)
        outputs = await _transcribe(
            engine,
            "s#1",
            [
                {"language": "xx", "item": "bad", "audio": speech},
                {"turn": "commit"},
                {"language": "", "item": "good", "audio": speech},
            ],
        )
        assert outputs[0]["item"] == "bad"
        assert "xx" in str(outputs[0]["transcript_error"])
        assert outputs[-1]["item"] == "good"
        assert isinstance(outputs[-1]["transcript"], str)
    finally:
        await engine.abort(SessionKey("s#1"))
        await engine.stop()


async def test_a_transcript_has_at_most_max_transcript_tokens_with_or_without_a_prompt(
    cache: Path,
) -> None:
    engine = AsrEngine(AsrArgs(cache_dir=cache, max_transcript_tokens=7))
    await engine.start()
    try:
        speech = _speech(4, 0.5)
        outputs = await _transcribe(
            engine,
            "s#1",
            [
                {"item": "plain", "audio": speech},
                {"turn": "commit"},
                {"language": "en", "prompt": "a long prompt before it", "item": "prompted"},
                {"audio": speech},
            ],
        )
        texts = {o["item"]: str(o["transcript"]) for o in outputs if "transcript" in o}
        # Byte-level tokens, one character each; random weights never pick the end, so
        # each transcript runs to its bound, the prompt's tokens not counted.
        assert {item: len(text) for item, text in texts.items()} == {"plain": 7, "prompted": 7}
    finally:
        await engine.release(SessionKey("s#1"))
        await engine.stop()


def test_tiny_whisper_s_weights_do_not_depend_on_other_threads_drawing(tmp_path: Path) -> None:
    """A transcriber prepares tiny-whisper on first use while the pipeline's other
    stages load in threads of the same process; drawing from the global RNG there made
    its weights (and so its transcripts) differ now and then. They depend on the seed
    alone."""
    import threading

    from safetensors.torch import load_file

    from omni_actors.actors.engines.asr.tiny_whisper import write_tiny_whisper

    def written(where: Path) -> dict[str, torch.Tensor]:
        write_tiny_whisper(where, seed=0)
        return load_file(str(where / "model.safetensors"))

    alone = written(tmp_path / "alone")
    drawing, stop = threading.Event(), threading.Event()

    def draw() -> None:
        while not stop.is_set():
            torch.randn(64)
            drawing.set()

    other = threading.Thread(target=draw, name="another stage loading")
    other.start()
    try:
        assert drawing.wait(10.0)
        beside = written(tmp_path / "beside")
    finally:
        stop.set()
        other.join(10.0)
    assert alone.keys() == beside.keys()
    assert all(torch.equal(alone[name], beside[name]) for name in alone)
