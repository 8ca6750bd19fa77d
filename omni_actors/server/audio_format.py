"""The OpenAI Realtime API's audio formats: base64 text <-> samples, and back.

A realtime client sends and receives audio as base64 text in one of three formats (GA
names; the beta API's names are accepted through :data:`BETA_FORMATS`):

- ``audio/pcm``: PCM16, little-endian, mono, 24 kHz (beta ``pcm16``);
- ``audio/pcmu``: G.711 μ-law, 8 kHz (beta ``g711_ulaw``), for telephony;
- ``audio/pcma``: G.711 A-law, 8 kHz (beta ``g711_alaw``).

Input goes to :meth:`Session.send` as int16 samples at the format's rate (the session
resamples for the thinker itself); output is the pipeline's float samples, converted
per response by :class:`OutputAudio` (resampled as one stream, so a response's deltas
join without clicks).

Every 20 ms frame of every session passes through here, so the work is vectorised:
G.711 is a table lookup per direction (the tables are built once, at import, from the
ITU-T G.711 segment rules: the same codes as the reference implementation that
``audioop`` carries), never a Python loop per sample.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
import torch

from omni_actors.audio.resample import StreamResampler
from omni_actors.audio.samples import pcm16_tensor
from omni_actors.errors import InvalidRequestError

__all__ = [
    "BETA_FORMATS",
    "AudioFormatName",
    "AudioPayloadError",
    "AudioPayloadReason",
    "OutputAudio",
    "decode_audio",
    "encode_audio",
    "format_rate",
]

AudioFormatName = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
"""A format's GA name (the ``type`` of the session's ``audio.input.format``)."""

BETA_FORMATS: Final[dict[str, AudioFormatName]] = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}
"""The beta API's format names (``input_audio_format: "pcm16"``) -> their GA names."""

_RATES: Final[dict[AudioFormatName, int]] = {
    "audio/pcm": 24_000,
    "audio/pcmu": 8_000,
    "audio/pcma": 8_000,
}

AudioPayloadReason = Literal["invalid_base64", "odd_length", "empty", "too_large"]
"""Why a payload was refused, for programs (an ``error`` event's code)."""


class AudioPayloadError(InvalidRequestError):
    """A client's base64 audio cannot be taken; nothing of it was used.

    Attributes:
        reason: what is wrong, for programs.
        param: the event field that held the payload (an ``error`` event's ``param``).
    """

    def __init__(self, message: str, *, reason: AudioPayloadReason, param: str = "audio") -> None:
        super().__init__(message)
        self.reason: AudioPayloadReason = reason
        self.param = param


def format_rate(name: AudioFormatName) -> int:
    """The sample rate (Hz) of format ``name``: 24000 for PCM16, 8000 for G.711.

    Raises:
        ValueError: ``name`` is no GA format name (map beta names with ``BETA_FORMATS``).
    """
    try:
        return _RATES[name]
    except KeyError:
        raise ValueError(f"unknown audio format {name!r}: use one of {', '.join(_RATES)}") from None


# --- G.711 (ITU-T G.711, as its reference implementation computes it) -----------------

_Int16 = npt.NDArray[np.int16]
_UInt8 = npt.NDArray[np.uint8]


def _all_int16() -> npt.NDArray[np.int32]:
    # Indexed by an int16 sample's bit pattern read as uint16, so encoding is one
    # gather over a view of the samples, with no offset added.
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)


def _ulaw_encode_table() -> _UInt8:
    # μ-law codes 14-bit magnitudes: bias by 33, find the segment (the power of two
    # the biased magnitude falls under), keep 4 mantissa bits; all bits inverted.
    value = _all_int16() >> 2
    negative = value < 0
    magnitude = np.minimum(np.where(negative, -value, value), 8159) + 33
    ends = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
    segment = np.searchsorted(ends, magnitude, side="left")
    mantissa = (magnitude >> (segment + 1)) & 0x0F
    code = np.where(segment >= 8, 0x7F, (segment << 4) | mantissa)
    code = code ^ np.where(negative, 0x7F, 0xFF)
    table: _UInt8 = code.astype(np.uint8)  # numpy releases type the shifts differently
    return table


def _ulaw_decode_table() -> _Int16:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((code & 0x0F) << 3) + 0x84) << ((code & 0x70) >> 4)
    table: _Int16 = np.where(code & 0x80, 0x84 - t, t - 0x84).astype(np.int16)
    return table


def _alaw_encode_table() -> _UInt8:
    # A-law codes 13-bit magnitudes: segment by power of two, 4 mantissa bits (the
    # first two segments share one step), even bits inverted (0x55).
    value = _all_int16() >> 3
    negative = value < 0
    magnitude = np.where(negative, -value - 1, value)
    ends = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
    segment = np.searchsorted(ends, magnitude, side="left")  # at most 7: 13 bits fit
    mantissa = (magnitude >> np.maximum(segment, 1)) & 0x0F
    code = (segment << 4) | mantissa
    code = code ^ np.where(negative, 0x55, 0xD5)
    table: _UInt8 = code.astype(np.uint8)
    return table


def _alaw_decode_table() -> _Int16:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    segment = (code & 0x70) >> 4
    t = ((code & 0x0F) << 4) + np.where(segment == 0, 8, 0x108)
    t = t << np.maximum(segment - 1, 0)
    table: _Int16 = np.where(code & 0x80, t, -t).astype(np.int16)
    return table


_ENCODE: Final[dict[AudioFormatName, _UInt8]] = {
    "audio/pcmu": _ulaw_encode_table(),
    "audio/pcma": _alaw_encode_table(),
}
_DECODE: Final[dict[AudioFormatName, _Int16]] = {
    "audio/pcmu": _ulaw_decode_table(),
    "audio/pcma": _alaw_decode_table(),
}


# --- base64 text <-> samples -----------------------------------------------------------


def decode_audio(data: str, name: AudioFormatName, *, max_bytes: int) -> torch.Tensor:
    """A client's base64 audio as 1-D int16 samples at ``format_rate(name)``.

    G.711 codes are expanded to 16-bit linear samples. The size is checked on the
    base64 text before decoding, so an oversized payload costs nothing.

    Args:
        data: the base64 text (standard alphabet, padded; whitespace is refused).
        name: the payload's format.
        max_bytes: the most decoded bytes accepted (the server's ``max_append_bytes``).

    Raises:
        AudioPayloadError: the payload is empty, not strict base64, larger than
            ``max_bytes``, or (PCM16) an odd number of bytes.
    """
    format_rate(name)  # a programming error (an unknown name) is no client's fault
    if not data:
        raise AudioPayloadError(
            "the audio payload is empty: send base64 audio of at least one sample",
            reason="empty",
        )
    # Valid base64 of n bytes is 4*ceil(n/3) characters: anything longer decodes to
    # more than max_bytes (or is invalid), so it is refused without decoding.
    if len(data) > 4 * math.ceil(max_bytes / 3):
        raise AudioPayloadError(
            f"the audio payload is about {len(data) * 3 // 4} bytes, over the limit of "
            f"{max_bytes} bytes per message: send the audio in smaller pieces",
            reason="too_large",
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise AudioPayloadError(
            f"the audio payload is not valid base64 ({error}): encode the audio bytes "
            "with standard base64 (A-Z a-z 0-9 + /, '=' padding, no whitespace)",
            reason="invalid_base64",
        ) from None
    if not raw:
        raise AudioPayloadError(
            "the audio payload decodes to no bytes: send at least one sample",
            reason="empty",
        )
    if len(raw) > max_bytes:
        raise AudioPayloadError(
            f"the audio payload is {len(raw)} bytes, over the limit of {max_bytes} bytes "
            "per message: send the audio in smaller pieces",
            reason="too_large",
        )
    if name == "audio/pcm":
        if len(raw) % 2:
            raise AudioPayloadError(
                f"the audio payload is {len(raw)} bytes, but PCM16 audio has 2 bytes per "
                "sample: send whole samples (an even number of bytes)",
                reason="odd_length",
            )
        return pcm16_tensor(raw)
    samples: _Int16 = _DECODE[name][np.frombuffer(raw, dtype=np.uint8)]
    return torch.from_numpy(samples)


def _to_int16(samples: torch.Tensor) -> _Int16:
    """Float samples in [-1, 1] (clipped; NaN as 0) or int16 samples -> int16."""
    flat = samples.detach().reshape(-1).cpu()
    if flat.dtype == torch.int16:
        result: _Int16 = flat.numpy()
        return result
    # x * 32768 is the inverse of the int16 -> float scaling the session uses
    # (int16 / 32768), so int16 audio survives a round trip through float exactly.
    x = np.nan_to_num(flat.to(torch.float32).numpy(), nan=0.0) * np.float32(32768.0)
    pcm: _Int16 = np.rint(np.clip(x, -32768.0, 32767.0)).astype(np.int16)
    return pcm


def encode_audio(samples: torch.Tensor, name: AudioFormatName) -> str:
    """Samples (float in [-1, 1], clipped, or int16) as base64 text in format ``name``.

    The samples must already be at ``format_rate(name)``; :class:`OutputAudio`
    resamples a stream for you.
    """
    format_rate(name)
    pcm = _to_int16(samples)
    if name == "audio/pcm":
        payload = pcm.astype("<i2", copy=False).tobytes()
    else:
        payload = _ENCODE[name][pcm.view(np.uint16)].tobytes()
    return base64.b64encode(payload).decode("ascii")


class OutputAudio:
    """One response's audio output, converted to the client's format as it streams.

    The pipeline produces float samples at ``source_rate`` (``spec.outputs.sample_rate``);
    a client may want another rate (G.711's 8 kHz). The deltas of one response are
    resampled as one stream, so the decoded deltas joined equal the whole response
    converted at once (no click at a delta boundary). Make one per response.

    Args:
        source_rate: the rate of the samples given to :meth:`encode`.
        name: the client's output format.
    """

    def __init__(self, source_rate: int, name: AudioFormatName) -> None:
        self.name: AudioFormatName = name
        self.rate = format_rate(name)
        self._resampler = (
            StreamResampler(source_rate, self.rate) if source_rate != self.rate else None
        )

    def encode(self, samples: torch.Tensor) -> str:
        """The base64 delta for the next ``samples``; "" when the resampler holds them all.

        A resampler needs a few samples after each output sample, so a short piece may
        come out with a later one (or with :meth:`flush`); send no delta for "".
        """
        if self._resampler is not None:
            samples = self._resampler.push(samples.detach().reshape(-1).cpu().to(torch.float32))
        return encode_audio(samples, self.name) if samples.numel() else ""

    def flush(self) -> str:
        """The response's last samples held by the resampler, as base64; "" if none."""
        if self._resampler is None:
            return ""
        tail = self._resampler.flush()
        return encode_audio(tail, self.name) if tail.numel() else ""
