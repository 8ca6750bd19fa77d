"""tiny-cascade end to end: recognizer, LLM, synthesizer and decoder behind the pipeline."""

from __future__ import annotations

import contextlib
import json
import math
from importlib import resources
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from test_tiny_omni_pipeline import audio_of, collect, done, nothing_held, text_of

from omni_actors.actors.engines.cascade.tts_engine import SynthesizerArgs
from omni_actors.cli import main
from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.pipeline.voices import UnknownVoiceError
from omni_actors.protocols.events import AudioDelta, ResponseDone
from omni_actors.testing import eventually, kill_worker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    prepare("tiny-cascade", cache_dir=root)
    return root


def spec_of(cache: Path, *, workers: bool = False) -> PipelineSpec:
    """The preset on ``cache``'s weights; its worker stages in this process unless
    ``workers`` (a worker's start imports torch again: seconds per stage)."""
    spec = load_pipeline("tiny-cascade").with_weights(cache_dir=cache)
    return spec if workers else spec.with_process_stages(False)


def _tone(seconds: float = 0.5) -> torch.Tensor:
    return torch.sin(torch.arange(int(16000 * seconds)) * 2 * math.pi * 330 / 16000) * 0.3


async def test_text_in_text_and_audio_out_and_full_edges_say_the_same(cache: Path) -> None:
    async with OmniPipeline(spec_of(cache)) as omni:
        stream = await collect(omni, text="Hello, who are you?")
        await nothing_held(omni)
    async with OmniPipeline(spec_of(cache).with_full_edges()) as omni:
        full = await collect(omni, text="Hello, who are you?")
    text, audio = text_of(stream), audio_of(stream)
    assert text
    assert audio.numel() > 0
    assert bool(torch.isfinite(audio).all())
    assert done(stream).metrics.ttfa_ms is not None
    # The first audio is the first frame alone (80 ms at 24 kHz): nothing waits for a second.
    first = next(e for e in stream if isinstance(e, AudioDelta))
    assert first.audio.numel() == 1920
    # Phrases cut from the stream are the phrases cut from the whole text, and the
    # decoder's windows reach back far enough: the same reply, the same audio.
    assert text_of(full) == text
    assert torch.allclose(audio_of(full), audio, atol=1e-4)


async def _spoken(session: Session, voice: str) -> torch.Tensor:
    await session.send(text="Hello, who are you?")
    response = await session.respond(voice=voice)
    events = [e async for e in response.events()]
    assert isinstance(response.done, ResponseDone)
    assert response.done.status == "completed", response.done
    return audio_of(events)


async def test_csm_speakers_are_the_voices_and_openai_names_map_onto_them(cache: Path) -> None:
    async with OmniPipeline(spec_of(cache)) as omni:
        voices = await omni.voices()
        assert voices.speakers == ("0", "1")  # the synthesizer's speakers argument
        assert (voices.speaker("alloy"), voices.speaker("ash")) == ("0", "1")
        said = {}
        for voice in ("1", "ash"):
            async with omni.session() as session:
                said[voice] = await _spoken(session, voice)
        assert torch.equal(said["ash"], said["1"])  # the speaker it maps to
        async with omni.session() as session:
            await session.send(text="Hello")
            with pytest.raises(UnknownVoiceError, match="unknown voice '7'"):
                await session.respond(voice="7")
        await nothing_held(omni)


def test_a_default_speaker_past_the_speakers_is_refused() -> None:
    with pytest.raises(ValidationError, match="speaker 2 is not one of the 2 speakers"):
        SynthesizerArgs(speaker=2)
    assert SynthesizerArgs(speaker=2, speakers=3).speaker == 2


async def test_a_voice_conversation_with_barge_in(cache: Path) -> None:
    async with OmniPipeline(spec_of(cache, workers=True)) as omni:
        async with omni.session() as session:
            for piece in _tone().split(1600):  # 100 ms microphone frames
                await session.send(audio=piece)
            await session.end_segment()
            first = [e async for e in session.events()]
            assert isinstance(first[-1], ResponseDone)
            assert text_of(first)
            assert audio_of(first).numel() > 0
            # The caller speaks over the second reply: it is cancelled on every stage.
            for piece in _tone(0.3).split(1600):
                await session.send(audio=piece)
            second = await session.end_segment()
            async for event in session.events():
                if isinstance(event, AudioDelta):
                    break
            assert await session.cancel_response(second)
            rest = [e async for e in session.events()]
            assert isinstance(rest[-1], ResponseDone)
            assert rest[-1].status == "cancelled"
            # ... and the conversation goes on.
            await session.send(text="And now?")
            await session.finish()
            last = [e async for e in session.events()]
            done(last)
            assert text_of(last)
        await nothing_held(omni)


async def _turn(session: Session, text: str) -> tuple[str, int | None]:
    """The reply to a typed user turn, and the prompt the LLM answered it from."""
    await session.send(text=text)
    response = await session.respond()
    said = text_of([e async for e in response.events()])
    assert isinstance(response.done, ResponseDone)
    assert response.done.status == "completed", response.done
    return said, response.done.metrics.stages["llm"].prompt_tokens


async def test_the_llm_restarted_under_a_conversation_holds_its_replies(cache: Path) -> None:
    # The recognizer passes the conversation on; the LLM holds it and writes the
    # replies. Its worker dies between two turns: the replay gives it back the user
    # turns and the replies the caller received, so the third turn is answered from the
    # same prompt, with the same reply, as in the conversation nothing interrupted.
    spec = spec_of(cache)
    assert spec.reply_stage == "llm"
    stages = tuple(s.model_copy(update={"process": s.name == "llm"}) for s in spec.stages)
    turns = ("Hello, who are you?", "And what do you do?", "Tell me more.")
    async with OmniPipeline(spec.model_copy(update={"stages": stages})) as omni:
        async with omni.session(modalities=("text",)) as session:
            whole = [await _turn(session, text) for text in turns]
        async with omni.session(modalities=("text",)) as session:
            before = [await _turn(session, text) for text in turns[:2]]
            kill_worker((await omni.stages())["llm"])

            async def told() -> None:
                assert session.channel.stale

            await eventually(told)
            after = await _turn(session, turns[2])
    assert before == whole[:2]
    assert after == whole[2]


async def _reply_then_turn(session: Session, heard_ms: float | None) -> tuple[str, str | None, int]:
    """A spoken reply, truncated to ``heard_ms`` of it if given, then the next turn:
    the reply's text, the text heard, and the prompt the LLM answered the turn from."""
    await session.send(text="Hello, who are you?")
    response = await session.respond()
    said = text_of([e async for e in response.events()])
    heard = None if heard_ms is None else await session.truncate(audio_ms=heard_ms)
    await session.send(text="And you?")
    following = await session.respond()
    [e async for e in following.events()]
    assert isinstance(following.done, ResponseDone)
    prompt = following.done.metrics.stages["llm"].prompt_tokens
    assert prompt is not None
    return said, heard, prompt


async def test_truncate_keeps_the_text_the_user_heard_and_the_llm_goes_on_from_it(
    cache: Path,
) -> None:
    # The user heard three frames (240 ms) of the first phrase: four frames a word, its
    # 18 characters three words' worth, so about a quarter of its characters.
    async with OmniPipeline(spec_of(cache)) as omni:
        async with omni.session() as session:
            whole, _, uncut = await _reply_then_turn(session, None)
        async with omni.session() as session:
            said, heard, cut = await _reply_then_turn(session, 240)
        await nothing_held(omni)
    assert said == whole
    assert heard is not None
    assert 0 < len(heard) < len(said)
    assert said.startswith(heard)
    # tiny-cascade's LLM writes a character a token: its conversation lost the rest.
    assert uncut - cut == len(said) - len(heard)


async def test_abort_mid_stream_frees_every_stage(cache: Path) -> None:
    async with OmniPipeline(spec_of(cache)) as omni:
        async with contextlib.aclosing(omni.generate(text="Tell me a long story")) as events:
            async for event in events:
                if isinstance(event, AudioDelta):
                    break
        await nothing_held(omni)
        done(await collect(omni, text="still serving"))


def test_bench_pipeline_compares_stream_and_full_edges(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The preset with every stage in this process (workers cost a start each).
    preset = resources.files("omni_actors").joinpath("presets", "tiny-cascade.yaml")
    local = tmp_path / "tiny-cascade.yaml"
    local.write_text(preset.read_text().replace("process: true", "process: false"))
    argv = ["bench", "pipeline", "--preset", str(local), "--json", "--cache-dir", str(cache)]
    quick = ["--concurrency", "1", "--requests", "2", "--reply-tokens", "24", "--no-input-length"]
    assert main([*argv, *quick]) == 0
    report = json.loads(capsys.readouterr().out)
    variants = report["variants"]
    stream, full = variants["tiny-cascade"]["1"], variants["tiny-cascade-full"]["1"]
    assert stream["errors"] == full["errors"] == 0
    assert stream["ttfa_ms_p50"] > 0
    assert full["ttfa_ms_p50"] > 0
    # How far streaming gets ahead is a measurement (docs/cascade.md), not a test: the
    # report says it.
    assert report["stream_vs_full_ttfa"]["1"] == pytest.approx(
        stream["ttfa_ms_p50"] / full["ttfa_ms_p50"], rel=1e-3
    )
