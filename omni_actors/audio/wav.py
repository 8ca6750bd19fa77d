"""WAV files in and out: audio as float tensors, with clear errors for bad input.

The CLI reads the caller's audio and writes the pipeline's output as 16-bit mono PCM.
Reading parses the RIFF chunks itself, because the standard library's ``wave`` module
reads integer PCM only, while recorders and audio editors often write 32-bit float
and ``WAVE_FORMAT_EXTENSIBLE`` headers (any file of more than two channels or 16 bits,
by Microsoft's rule). Read: integer PCM of 8, 16, 24 or 32 bits and IEEE float of 32 or
64 bits, plain or extensible, any number of channels (mixed down to mono), any rate.
Anything else (A-law, mu-law, ADPCM, MP3 in a WAV) is refused with the format's name.
Resampling is linear interpolation, good enough for feeding a speech encoder.
"""

from __future__ import annotations

import io
import struct
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from omni_actors.errors import OmniError

__all__ = ["AudioFormatError", "decode_wav", "encode_wav", "read_wav", "resample", "write_wav"]

_PCM, _FLOAT, _EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
# What a refused file holds, by its format tag (mmreg.h): named in the error.
_FORMAT_NAMES = {
    0x0002: "Microsoft ADPCM",
    0x0006: "A-law",
    0x0007: "mu-law",
    0x0011: "IMA ADPCM",
    0x0031: "GSM 6.10",
    0x0050: "MPEG",
    0x0055: "MP3",
    0x0092: "AC-3",
    0x00FF: "AAC",
    0x1610: "AAC",
    0xF1AC: "FLAC",
}
# An extensible header's sub-format GUID: the format tag, then this fixed suffix.
_GUID_SUFFIX = bytes.fromhex("000000001000800000aa00389b71")
_CONVERT = "convert it, e.g. `ffmpeg -i in.ext -ac 1 -ar 16000 -sample_fmt s16 out.wav`"


class AudioFormatError(OmniError, ValueError):
    """A file is not audio omni-actors can read; the message says what is wrong."""


def read_wav(path: str | Path, *, rate: int | None = None) -> tuple[torch.Tensor, int]:
    """Samples of a WAV file as float32 mono, and their sample rate.

    Integer PCM (8, 16, 24 or 32 bits) is scaled to [-1, 1); float samples (32 or 64
    bits) are taken as they are. Several channels are averaged.

    Args:
        path: the file.
        rate: resample to this rate (the returned rate is then ``rate``).

    Raises:
        AudioFormatError: unreadable, not a WAV, a format other than PCM or float
            (the message names it), a NaN or infinite sample, or empty.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise AudioFormatError(f"{path}: no such file") from None
    except OSError as exc:
        raise AudioFormatError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return _decode(data, path, rate)


def decode_wav(data: bytes, *, rate: int | None = None) -> tuple[torch.Tensor, int]:
    """:func:`read_wav` for a WAV file's bytes (audio a client sent in a request).

    Raises:
        AudioFormatError: as :func:`read_wav` (the message names "the WAV data").
    """
    return _decode(data, "the WAV data", rate)


@dataclass(frozen=True, slots=True)
class _Format:
    """What a ``fmt `` chunk says: the sample encoding, channels, rate."""

    tag: int  # _PCM or _FLOAT (an extensible header's sub-format)
    channels: int
    rate: int
    bits: int  # the container's bits per sample


def _decode(data: bytes, path: str | Path, rate: int | None) -> tuple[torch.Tensor, int]:
    fmt, frames = _chunks(data, path)
    if not frames:
        raise AudioFormatError(f"{path}: the file holds no audio")
    samples = _to_float(frames, fmt)
    usable = len(samples) - len(samples) % fmt.channels
    mono = samples[:usable].reshape(-1, fmt.channels).mean(axis=1, dtype=np.float64)
    if not np.isfinite(mono).all():
        raise AudioFormatError(f"{path}: the file holds NaN or infinite samples")
    audio = torch.from_numpy(np.ascontiguousarray(mono, dtype=np.float32))
    if rate is not None and rate != fmt.rate:
        return resample(audio, fmt.rate, rate), rate
    return audio, fmt.rate


def _not_wav(path: str | Path, why: str) -> AudioFormatError:
    return AudioFormatError(f"{path}: not a PCM WAV file ({why}); {_CONVERT}")


def _chunks(data: bytes, path: str | Path) -> tuple[_Format, bytes]:
    """The ``fmt `` chunk and the ``data`` chunk's bytes of a RIFF/WAVE file."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise _not_wav(path, "no RIFF/WAVE header")
    fmt: _Format | None = None
    offset = 12
    while offset + 8 <= len(data):
        kind = data[offset : offset + 4]
        size = int.from_bytes(data[offset + 4 : offset + 8], "little")
        body = data[offset + 8 : offset + 8 + size]
        if kind == b"fmt ":
            fmt = _format(body, path)
        elif kind == b"data":
            if fmt is None:
                raise _not_wav(path, "the data chunk comes before the fmt chunk")
            # A writer that streamed the file may leave the size unknown (0xFFFFFFFF):
            # the data runs to the end, and a cut-off last frame is dropped.
            whole = len(body) - len(body) % (fmt.channels * fmt.bits // 8)
            return fmt, body[:whole]
        offset += 8 + size + size % 2  # chunks are padded to an even size
    raise _not_wav(path, "no fmt chunk" if fmt is None else "no data chunk")


def _format(body: bytes, path: str | Path) -> _Format:
    if len(body) < 16:
        raise _not_wav(path, f"a fmt chunk of {len(body)} bytes")
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body)
    if tag == _EXTENSIBLE:
        if len(body) < 40:
            raise _not_wav(path, f"an extensible fmt chunk of {len(body)} bytes")
        guid = body[24:40]
        tag = int.from_bytes(guid[:2], "little") if guid[2:] == _GUID_SUFFIX else -1
    if tag not in (_PCM, _FLOAT):
        name = _FORMAT_NAMES.get(tag, "an unknown format" if tag < 0 else f"format tag {tag:#06x}")
        raise AudioFormatError(
            f"{path}: {name} audio is not supported (PCM or float WAV only); {_CONVERT}"
        )
    supported = (8, 16, 24, 32) if tag == _PCM else (32, 64)
    if bits not in supported:
        kind = "PCM" if tag == _PCM else "float"
        raise AudioFormatError(
            f"{path}: {bits}-bit {kind} samples are not supported "
            f"({'/'.join(map(str, supported))}-bit only); {_CONVERT}"
        )
    if channels == 0 or rate == 0:
        raise _not_wav(path, f"{channels} channels at {rate} Hz")
    return _Format(tag, channels, rate, bits)


def _to_float(frames: bytes, fmt: _Format) -> npt.NDArray[np.floating]:
    if fmt.tag == _FLOAT:
        return np.frombuffer(frames, "<f4" if fmt.bits == 32 else "<f8")
    if fmt.bits == 8:  # 8-bit WAV is unsigned
        return (np.frombuffer(frames, np.uint8).astype(np.float32) - 128.0) / 128.0
    if fmt.bits == 16:
        return np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0
    if fmt.bits == 24:
        raw = np.frombuffer(frames, np.uint8).reshape(-1, 3).astype(np.int32)
        value = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        value = np.where(value >= 1 << 23, value - (1 << 24), value)
        return value.astype(np.float32) / float(1 << 23)
    return np.frombuffer(frames, "<i4").astype(np.float64) / float(1 << 31)


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
