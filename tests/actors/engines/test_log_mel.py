"""tiny-omni's streaming log-mel front end: exact under any chunking, Whisper's otherwise.

See ``actors/engines/qwen3_omni/log_mel.py`` for its one deviation from Whisper (the floor
follows the loudest frame *so far*); these pin both halves of that statement.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni import configs
from omni_actors.actors.engines.qwen3_omni.log_mel import LogMel

RATE = configs.AUDIO_SAMPLE_RATE
EXTRACTOR = configs.audio_feature_extractor()


def clip(seconds: float, seed: int = 0, loud_from: float | None = None) -> np.ndarray:
    """Noisy 440 Hz tone; loudest at its start, or from ``loud_from`` seconds on."""
    n = int(RATE * seconds)
    t = np.arange(n) / RATE
    rng = np.random.default_rng(seed)
    wave = 0.05 * np.sin(2 * np.pi * 440.0 * t) + 0.01 * rng.standard_normal(n)
    if loud_from is None:
        wave[:300] *= 8.0
    else:
        wave[int(loud_from * RATE) :] *= 20.0
    return wave.astype(np.float32)


def streamed(samples: np.ndarray, piece: int) -> torch.Tensor:
    mel = LogMel(EXTRACTOR, block=100)
    frames = []
    for start in range(0, len(samples), piece):
        mel.push(samples[start : start + piece])
        frames.append(mel.take())
    frames.append(mel.finish())
    return torch.cat(frames, dim=1)


def whisper(samples: np.ndarray) -> torch.Tensor:
    out = EXTRACTOR(
        samples,
        sampling_rate=RATE,
        padding="longest",
        truncation=False,
        return_attention_mask=True,
        return_tensors="pt",
    )
    features: torch.Tensor = out["input_features"][0]
    return features


@pytest.mark.parametrize("seconds", [0.03, 1.0025, 2.3456, 9.31])
@pytest.mark.parametrize("piece", [320, 16039, 10**7])
def test_any_chunking_gives_the_same_frames_bit_for_bit(seconds: float, piece: int) -> None:
    samples = clip(seconds)
    one_shot = streamed(samples, len(samples))
    assert one_shot.shape == (128, len(samples) // 160)  # Whisper's frame count
    assert torch.equal(streamed(samples, piece), one_shot)


def test_tiny_pieces_give_the_same_frames_bit_for_bit() -> None:
    samples = clip(1.0025)
    assert torch.equal(streamed(samples, 7), streamed(samples, len(samples)))


def test_frames_are_whispers_when_the_clip_is_loudest_first() -> None:
    samples = clip(3.3)
    assert torch.allclose(streamed(samples, 320), whisper(samples), atol=1e-5, rtol=0)


def test_the_floor_follows_the_loudest_frame_so_far() -> None:
    samples = clip(3.0, loud_from=2.0)
    ours, theirs = streamed(samples, 320), whisper(samples)
    # From the loudest frame on, Whisper's clip-wide floor is the running one ...
    assert torch.allclose(ours[:, 205:], theirs[:, 205:], atol=1e-5, rtol=0)
    # ... before it, quieter frames keep detail Whisper floors away.
    assert (ours[:, :195] < theirs[:, :195] - 0.1).any()
    assert (ours[:, :195] <= theirs[:, :195] + 1e-6).all()


def test_a_frame_waits_only_for_the_samples_under_its_window() -> None:
    mel = LogMel(EXTRACTOR, block=100)
    samples = clip(2.0)
    # Block 0 (frames 0-99) needs samples up to 99 * 160 + 200.
    mel.push(samples[: 99 * 160 + 200])
    assert mel.ready() == 0
    mel.push(samples[99 * 160 + 200 : 99 * 160 + 201])
    assert mel.ready() == 100
    assert mel.take().shape == (128, 100)
    assert mel.ready() == 0


def test_clips_under_half_a_window_have_no_spectrogram() -> None:
    mel = LogMel(EXTRACTOR, block=100)
    mel.push(clip(1.0)[:150])
    assert mel.finish().shape == (128, 0)  # no whole hop: no frame, as Whisper
    short = LogMel(EXTRACTOR, block=100)
    short.push(clip(1.0)[:180])
    with pytest.raises(ValueError, match="too short"):
        short.finish()
