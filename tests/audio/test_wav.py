"""WAV in and out: formats, mono mixdown, resampling, and clear errors for bad files.

Files the standard library's ``wave`` cannot write (float, extensible headers, A-law)
are written by hand, chunk by chunk."""

from __future__ import annotations

import struct
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


GUID_SUFFIX = bytes.fromhex("000000001000800000aa00389b71")  # KSDATAFORMAT_SUBTYPE_*


def _fmt(tag: int, channels: int, rate: int, bits: int, sub: int | None = None) -> bytes:
    block = channels * bits // 8
    body = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    if sub is not None:  # WAVE_FORMAT_EXTENSIBLE: cbSize, valid bits, channel mask, GUID
        body += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", sub) + GUID_SUFFIX
    return body


def _riff(fmt: bytes, data: bytes, *, before: bytes = b"", size: int | None = None) -> bytes:
    chunks = (
        before
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(data) if size is None else size)
        + data
    )
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


@pytest.mark.parametrize(
    ("tag", "sub"), [(3, None), (0xFFFE, 3)], ids=["float", "extensible-float"]
)
@pytest.mark.parametrize("bits", [32, 64])
def test_float_wavs_plain_and_extensible(
    tmp_path: Path, tag: int, sub: int | None, bits: int
) -> None:
    left = np.array([0.5, -0.25, 1.0, -1.0])
    right = np.array([0.25, 0.25, 0.0, 0.5])
    data = np.stack([left, right], axis=1).astype(f"<f{bits // 8}").tobytes()
    (tmp_path / "f.wav").write_bytes(_riff(_fmt(tag, 2, 22050, bits, sub), data))
    mono, rate = read_wav(tmp_path / "f.wav")
    assert rate == 22050
    assert mono.dtype == torch.float32
    np.testing.assert_array_equal(mono.numpy(), ((left + right) / 2).astype(np.float32))


@pytest.mark.parametrize("bits", [8, 16, 24, 32])
def test_extensible_pcm_with_many_channels(bits: int) -> None:
    scale = 1 << (bits - 1)
    ints = np.array([[scale // 2, -scale // 2, 0], [-scale // 4, scale // 4, scale // 4]])
    flat = ints.reshape(-1)
    if bits == 8:
        data = (flat + 128).astype(np.uint8).tobytes()
    elif bits == 24:
        data = b"".join(int(v).to_bytes(3, "little", signed=True) for v in flat)
    else:
        data = flat.astype(f"<i{bits // 8}").tobytes()
    mono, rate = decode_wav(_riff(_fmt(0xFFFE, 3, 48000, bits, 1), data))
    assert rate == 48000
    expected = ints.mean(axis=1) / scale
    np.testing.assert_allclose(mono.numpy(), expected, rtol=0, atol=1e-7)


def test_chunks_before_fmt_odd_sizes_and_a_streamed_data_size_are_read() -> None:
    pcm = np.array([0, 8192, -8192, 16384], "<i2")
    # A LIST chunk of odd size (padded by one byte) before fmt, as editors write.
    listing = b"LIST" + struct.pack("<I", 5) + b"INFOx" + b"\0"
    wav = _riff(_fmt(1, 1, 16000, 16), pcm.tobytes(), before=listing, size=0xFFFFFFFF)
    mono, _ = decode_wav(wav + b"\x01")  # a cut-off last sample is dropped
    np.testing.assert_array_equal(mono.numpy(), pcm / 32768.0)


@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        (_fmt(6, 1, 8000, 8), "A-law"),
        (_fmt(7, 1, 8000, 8), "mu-law"),
        (_fmt(0xFFFE, 1, 8000, 8, 7), "mu-law"),
        (_fmt(0x55, 1, 16000, 16), "MP3"),
        (_fmt(0x2000, 1, 16000, 16), "format tag 0x2000"),
        (_fmt(1, 1, 16000, 12), "12-bit PCM"),
        (_fmt(3, 1, 16000, 16), "16-bit float"),
    ],
    ids=["alaw", "ulaw", "extensible-ulaw", "mp3", "unknown-tag", "pcm12", "float16"],
)
def test_other_formats_are_refused_by_name(fmt: bytes, name: str) -> None:
    with pytest.raises(AudioFormatError, match=name):
        decode_wav(_riff(fmt, bytes(64)))


def test_malformed_headers_and_nan_samples_are_refused() -> None:
    odd_guid = _fmt(0xFFFE, 1, 16000, 16, 1)[:-1] + b"\xff"
    with pytest.raises(AudioFormatError, match="unknown format"):
        decode_wav(_riff(odd_guid, bytes(8)))
    with pytest.raises(AudioFormatError, match="extensible fmt chunk"):
        decode_wav(_riff(_fmt(0xFFFE, 1, 16000, 16, 1)[:20], bytes(8)))
    with pytest.raises(AudioFormatError, match="0 channels"):
        decode_wav(_riff(_fmt(1, 0, 16000, 16), bytes(8)))
    with pytest.raises(AudioFormatError, match="no data chunk"):
        decode_wav(_riff(_fmt(1, 1, 16000, 16), b"")[:-8])
    nan = np.array([0.1, np.nan], "<f4").tobytes()
    with pytest.raises(AudioFormatError, match="NaN"):
        decode_wav(_riff(_fmt(3, 1, 16000, 32), nan))
