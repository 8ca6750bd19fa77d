"""WAV in and out: formats, mono mixdown, resampling, and clear errors for bad files."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.audio.wav import (
    AudioFormatError,
    decode_wav,
    encode_wav,
    read_wav,
    resample,
    write_wav,
)


def _write_raw(path: Path, data: bytes, *, channels: int, width: int, rate: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(data)


def test_round_trip_pcm16(tmp_path: Path) -> None:
    tone = torch.sin(torch.arange(2400) / 10.0) * 0.5
    write_wav(tmp_path / "a.wav", tone, 24000)
    back, rate = read_wav(tmp_path / "a.wav")
    assert rate == 24000
    assert back.dtype == torch.float32
    assert torch.allclose(back, tone, atol=1 / 32767)
    with wave.open(str(tmp_path / "a.wav")) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)


def test_clipping_on_write(tmp_path: Path) -> None:
    write_wav(tmp_path / "a.wav", torch.tensor([2.0, -2.0, 0.0]), 8000)
    back, _ = read_wav(tmp_path / "a.wav")
    assert back.tolist() == pytest.approx([32767 / 32768, -32767 / 32768, 0.0])


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_every_pcm_width_and_stereo_mixdown(tmp_path: Path, width: int) -> None:
    left = np.array([0.5, -0.5, 0.25], dtype=np.float64)
    right = np.array([0.5, 0.5, -0.25], dtype=np.float64)
    scale = {1: 127, 2: 32767, 3: 8388607, 4: 2147483647}[width]
    interleaved = np.stack([left, right], axis=1).reshape(-1)
    ints = np.round(interleaved * scale).astype(np.int64)
    if width == 1:
        data = (ints + 128).astype(np.uint8).tobytes()
    elif width == 3:
        data = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints)
    else:
        data = ints.astype(f"<i{width}").tobytes()
    _write_raw(tmp_path / "s.wav", data, channels=2, width=width, rate=16000)
    mono, rate = read_wav(tmp_path / "s.wav")
    assert rate == 16000
    assert mono.tolist() == pytest.approx([0.5, 0.0, 0.0], abs=2 / 128)


def test_resampling_keeps_duration(tmp_path: Path) -> None:
    write_wav(tmp_path / "a.wav", torch.zeros(48000), 48000)
    audio, rate = read_wav(tmp_path / "a.wav", rate=16000)
    assert rate == 16000
    assert audio.numel() == 16000
    assert resample(torch.ones(10), 10, 10).numel() == 10
    with pytest.raises(ValueError, match="positive"):
        resample(torch.ones(10), 0, 10)


def test_bad_files_raise_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AudioFormatError, match="no such file"):
        read_wav(tmp_path / "missing.wav")
    (tmp_path / "text.wav").write_text("not audio at all")
    with pytest.raises(AudioFormatError, match="not a PCM WAV file"):
        read_wav(tmp_path / "text.wav")
    _write_raw(tmp_path / "empty.wav", b"", channels=1, width=2, rate=16000)
    with pytest.raises(AudioFormatError, match="no audio"):
        read_wav(tmp_path / "empty.wav")
    truncated = tmp_path / "ok.wav"
    write_wav(truncated, torch.zeros(100), 16000)
    (tmp_path / "cut.wav").write_bytes(truncated.read_bytes()[:30])
    with pytest.raises(AudioFormatError):
        read_wav(tmp_path / "cut.wav")


def test_wav_bytes_round_trip_in_memory() -> None:
    pcm = np.array([0, 1000, -1000, 32767, -32768], "<i2")
    back, rate = decode_wav(encode_wav(pcm.tobytes(), 16000))
    assert rate == 16000
    np.testing.assert_array_equal(back.numpy(), pcm / 32768.0)
    with pytest.raises(AudioFormatError, match="the WAV data: not a PCM WAV file"):
        decode_wav(b"RIFF but nothing else")
