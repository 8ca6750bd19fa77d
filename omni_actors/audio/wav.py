"""WAV files in and out: PCM audio as float tensors, with clear errors for bad input.

The CLI reads the caller's audio (any PCM WAV: 8/16/24/32-bit, mono or stereo, any rate)
and writes the pipeline's output as 16-bit mono PCM. Only the standard library's
``wave`` module is needed; resampling is linear interpolation, good enough for feeding a
speech encoder.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from omni_actors.errors import OmniError

__all__ = ["AudioFormatError", "decode_wav", "encode_wav", "read_wav", "resample", "write_wav"]


class AudioFormatError(OmniError, ValueError):
    """A file is not audio omni-actors can read; the message says what is wrong."""


def read_wav(path: str | Path, *, rate: int | None = None) -> tuple[torch.Tensor, int]:
    """Samples of a PCM WAV file as float32 mono in [-1, 1], and their sample rate.

    Args:
        path: the file.
        rate: resample to this rate (the returned rate is then ``rate``).

    Raises:
        AudioFormatError: unreadable, not a WAV, not PCM, or empty.
    """
    return _read(str(path), path, rate)


def decode_wav(data: bytes, *, rate: int | None = None) -> tuple[torch.Tensor, int]:
    """:func:`read_wav` for a WAV file's bytes (audio a client sent in a request).

    Raises:
        AudioFormatError: not a WAV, not PCM, or empty (the message names "the WAV data").
    """
    return _read(io.BytesIO(data), "the WAV data", rate)


def _read(source: str | BinaryIO, path: str | Path, rate: int | None) -> tuple[torch.Tensor, int]:
    try:
        with wave.open(source, "rb") as wav:
            channels = wav.getnchannels()
            width = wav.getsampwidth()
            source_rate = wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except FileNotFoundError:
        raise AudioFormatError(f"{path}: no such file") from None
    except (wave.Error, EOFError, OSError) as exc:
        raise AudioFormatError(
            f"{path}: not a PCM WAV file ({exc or type(exc).__name__}); convert it, e.g. "
            "`ffmpeg -i in.ext -ac 1 -ar 16000 -sample_fmt s16 out.wav`"
        ) from None
    if not frames:
        raise AudioFormatError(f"{path}: the file holds no audio")
    samples = _to_float(frames, width, path)
    usable = len(samples) - len(samples) % channels
    mono = samples[:usable].reshape(-1, channels).mean(axis=1)
    audio = torch.from_numpy(np.ascontiguousarray(mono, dtype=np.float32))
    if rate is not None and rate != source_rate:
        return resample(audio, source_rate, rate), rate
    return audio, source_rate


def _to_float(frames: bytes, width: int, path: str | Path) -> np.ndarray:
    if width == 1:  # 8-bit WAV is unsigned
        return (np.frombuffer(frames, np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 2:
        return np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0
    if width == 3:
        raw = np.frombuffer(frames, np.uint8).reshape(-1, 3).astype(np.int32)
        value = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        value = np.where(value >= 1 << 23, value - (1 << 24), value)
        return value.astype(np.float32) / float(1 << 23)
    if width == 4:
        return np.frombuffer(frames, "<i4").astype(np.float32) / float(1 << 31)
    raise AudioFormatError(f"{path}: {8 * width}-bit samples are not supported; use 16-bit PCM")


def resample(audio: torch.Tensor, source_rate: int, rate: int) -> torch.Tensor:
    """``audio`` (1-D) at ``rate`` Hz, by linear interpolation."""
    if source_rate <= 0 or rate <= 0:
        raise ValueError(f"sample rates must be positive, got {source_rate} -> {rate}")
    if source_rate == rate or audio.numel() == 0:
        return audio
    size = max(1, round(audio.numel() * rate / source_rate))
    return torch.nn.functional.interpolate(
        audio.view(1, 1, -1).float(), size=size, mode="linear", align_corners=False
    ).view(-1)


def write_wav(path: str | Path, audio: torch.Tensor, rate: int) -> None:
    """Write float samples (any shape, flattened) as 16-bit mono PCM, clipped to [-1, 1]."""
    pcm = (audio.detach().float().flatten().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    Path(path).write_bytes(encode_wav(pcm.numpy().astype("<i2").tobytes(), rate))


def encode_wav(pcm16: bytes, rate: int) -> bytes:
    """A WAV file of mono 16-bit little-endian PCM samples (a reply's audio, in memory)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm16)
    return out.getvalue()
