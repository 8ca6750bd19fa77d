"""The cascade's recognizer, synthesizer and codec decoder on tiny-cascade: each stage's
output is what transformers' own ``generate`` (or ``decode``) gives for the same input."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import torch

from omni_actors.actors.engines.asr.engine import AsrArgs
from omni_actors.actors.engines.cascade.mimi_engine import MimiArgs, MimiEngine
from omni_actors.actors.engines.cascade.recognizer import RecognizerEngine
from omni_actors.actors.engines.cascade.tts_engine import (
    SynthesizerArgs,
    SynthesizerEngine,
    SynthesizerInputError,
)
from omni_actors.actors.engines.contract import CONTEXT_FIELD, Fields, ResponseOptions
from omni_actors.models.cache import prepare
from omni_actors.protocols.stage import SessionKey

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare("tiny-cascade", cache_dir=tmp_path_factory.mktemp("weights"), seed=0)


async def _inputs(fields: Sequence[Fields]) -> AsyncIterator[Fields]:
    for item in fields:
        yield item


def _csm_codes(release: Path, text: str, frames: int, speaker: int = 0) -> torch.Tensor:
    """HF's greedy frames [frames, codebooks] for ``text`` by ``speaker``."""
    from transformers import AutoTokenizer, CsmForConditionalGeneration

    path = release / "tts"
    model = CsmForConditionalGeneration.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = [
        model.config.bos_token_id,
        *tokenizer.encode(f"[{speaker}]{text}", add_special_tokens=False),
    ]
    ids.append(tokenizer.eos_token_id)
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=frames, do_sample=False, depth_decoder_do_sample=False
    )
    return out[0]


async def test_synthesizer_frames_are_csm_generate(release: Path) -> None:
    # One phrase (a clause mark ends the first one), four frames per word.
    engine = SynthesizerEngine(
        SynthesizerArgs(model=str(release), first_words=8, max_frames_per_word=4)
    )
    await engine.start()
    try:
        text = ["Hello ", "there, ", "my friend"]
        outputs = [o async for o in engine.generate("s#1", _inputs([{"text": t} for t in text]))]
        codes = torch.cat([o["codes"] for o in outputs])
        first = _csm_codes(release, "Hello there,", 8)
        assert torch.equal(codes[:8], first)
        assert codes.shape == (8 + 8, 4)  # then "my friend": a phrase of its own
        # Sessions share steps and get what each would alone.
        both = [
            [o async for o in engine.generate(s, _inputs([{"text": "Hello there,"}]))]
            for s in ("s#2", "s#3")
        ]
        for outputs in both:
            assert torch.equal(torch.cat([o["codes"] for o in outputs]), first)
    finally:
        await engine.stop()


class _Respond:
    """A response's input as a stage hands it over: its fields, and its options."""

    def __init__(self, fields: Sequence[Fields], voice: str) -> None:
        self._fields = iter(fields)
        self.options = ResponseOptions(voice=voice)

    def __aiter__(self) -> _Respond:
        return self

    async def __anext__(self) -> Fields:
        try:
            return next(self._fields)
        except StopIteration:
            raise StopAsyncIteration from None


async def test_a_responses_voice_is_the_csm_speaker_it_names(release: Path) -> None:
    engine = SynthesizerEngine(SynthesizerArgs(model=str(release), max_frames_per_word=4))
    await engine.start()
    try:
        assert (engine.voices, engine.voice) == (["0", "1"], "0")
        text = "Hello, who are you?"
        said = [o async for o in engine.generate("s#1", _Respond([{"text": text}], "1"))]
        codes = torch.cat([o["codes"] for o in said])
        # The first phrase, "Hello,": one word, four frames, spoken by speaker 1.
        assert torch.equal(codes[:4], _csm_codes(release, "Hello,", 4, speaker=1))
        assert not torch.equal(codes[:4], _csm_codes(release, "Hello,", 4, speaker=0))
        with pytest.raises(SynthesizerInputError, match="unknown voice '7'"):
            async for _ in engine.generate("s#2", _Respond([{"text": text}], "7")):
                pass
    finally:
        await engine.stop()


async def test_text_without_spaces_is_spoken_as_its_length_in_words(release: Path) -> None:
    # A phrase with no whitespace (Chinese, Thai, random letters) is not one word:
    # 20 characters speak for 4 words' worth of frames, as "Internationalization" does.
    engine = SynthesizerEngine(
        SynthesizerArgs(model=str(release), first_words=8, max_frames_per_word=2)
    )
    await engine.start()
    try:
        text = "internationalization"
        outputs = [o async for o in engine.generate("s#1", _inputs([{"text": text}]))]
        codes = torch.cat([o["codes"] for o in outputs])
        assert codes.shape == (2 * 4, 4)
        assert torch.equal(codes, _csm_codes(release, text, 2 * 4))
    finally:
        await engine.stop()


async def test_mimi_windows_are_mimi_decode(release: Path) -> None:
    from transformers import MimiModel

    codes = torch.randint(0, 64, (10, 4), generator=torch.Generator().manual_seed(3))
    whole = MimiModel.from_pretrained(release / "mimi").eval()
    with torch.no_grad():
        expected = whole.decode(codes.T[None]).audio_values[0, 0]
    engine = MimiEngine(MimiArgs(model=str(release)))
    await engine.start()
    try:
        # A full edge's one window is the whole decode (the engine's one compute thread
        # sums in another order: the last bits may differ).
        (out,) = [o async for o in engine.generate("s#1", _inputs([{"codes": codes}]))]
        assert out["audio"].shape == expected.shape
        assert torch.allclose(out["audio"], expected, atol=1e-5)
        # Windows whose context reaches back to the start give the same samples.
        windows = [
            {"codes": codes[:4]},
            {"codes": codes[:10], CONTEXT_FIELD: torch.tensor(4)},
        ]
        outs = [o async for o in engine.generate("s#2", _inputs(windows))]
        assert [o["audio"].numel() for o in outs] == [4 * 1920, 6 * 1920]
        assert torch.allclose(torch.cat([o["audio"] for o in outs]), expected, atol=1e-5)
    finally:
        await engine.stop()


async def test_recognizer_text_is_whisper_generate_and_marks_pass(release: Path) -> None:
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    audio = torch.randn(16000, generator=torch.Generator().manual_seed(5)) * 0.1
    path = release / "asr"
    processor = WhisperProcessor.from_pretrained(path)
    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    model.generation_config.max_new_tokens, model.generation_config.max_length = None, 12
    features = processor(audio.numpy(), sampling_rate=16000, return_tensors="pt")
    ids = model.generate(features["input_features"])
    expected = processor.batch_decode(ids, skip_special_tokens=True)[0].strip()
    assert expected
    engine = RecognizerEngine(AsrArgs(model=str(release), max_transcript_tokens=12))
    await engine.start()
    try:
        fields: list[Fields] = [
            {"instructions": "Be brief."},
            {"item": "a", "audio": audio[:8000]},
            {"audio": audio[8000:]},
            {"turn": "commit"},
            {"audio": audio},
            {"turn": "clear"},
            {"text": "typed"},
        ]
        outputs = [o async for o in engine.generate(SessionKey("s#1"), _inputs(fields))]
        # A turn named by its item is the caller's too: its pieces as they are decoded
        # and its whole, in fields the LLM does not take; the LLM gets the whole once.
        pieces = [o for o in outputs if "transcript_delta" in o]
        assert len(pieces) > 1
        assert all(o.keys() == {"item", "transcript_delta"} and o["item"] == "a" for o in pieces)
        assert "".join(o["transcript_delta"] for o in pieces) == expected
        assert [o for o in outputs if "transcript_delta" not in o] == [
            {"instructions": "Be brief."},
            {"item": "a", "transcript": expected},
            {"text": expected},
            {"turn": "commit"},
            {"turn": "clear"},
            {"text": "typed"},
        ]
        # A turn named by none is the LLM's alone.
        unnamed: list[Fields] = [{"audio": audio}, {"turn": "commit"}]
        outputs = [o async for o in engine.generate(SessionKey("s#2"), _inputs(unnamed))]
        assert outputs == [{"text": expected}, {"turn": "commit"}]
    finally:
        await engine.stop()


def test_cascade_random_has_the_real_releases_sizes(tmp_path: Path) -> None:
    """``prepare cascade-random`` draws each model at its release's size: checked on the
    meta device (nothing drawn), with the tokenizers the writer pairs them with."""
    from transformers import (
        AutoTokenizer,
        CsmConfig,
        CsmForConditionalGeneration,
        Qwen3Config,
        Qwen3ForCausalLM,
        WhisperConfig,
        WhisperForConditionalGeneration,
    )

    from omni_actors.actors.engines.cascade.tiny_release import QWEN3_8B, WHISPER_TURBO
    from omni_actors.actors.engines.qwen3_omni.tokenizer import write_tokenizer

    write_tokenizer(tmp_path)
    assert len(AutoTokenizer.from_pretrained(tmp_path)) < QWEN3_8B["vocab_size"]

    def billions(model: torch.nn.Module) -> float:
        return sum(p.numel() for p in model.parameters()) / 1e9

    with torch.device("meta"):
        llm = Qwen3ForCausalLM(Qwen3Config(**QWEN3_8B))
        asr = WhisperForConditionalGeneration(WhisperConfig(**WHISPER_TURBO))
        tts = CsmForConditionalGeneration(CsmConfig())
    assert billions(llm) == pytest.approx(8.19, abs=0.01)  # Qwen3-8B: 8.2B
    assert billions(asr) == pytest.approx(0.809, abs=0.001)  # whisper-large-v3-turbo
    assert tts.config.num_codebooks == 32
    assert tts.codec_model.config.num_quantizers == 32
    # CsmConfig's defaults are sesame/csm-1b's (its docstring says so): a Llama-1B
    # backbone, a 4-layer depth decoder.
    assert (tts.config.hidden_size, tts.config.num_hidden_layers) == (2048, 16)
    assert tts.config.depth_decoder_config.num_hidden_layers == 4
