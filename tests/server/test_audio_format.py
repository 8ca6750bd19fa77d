"""Realtime audio formats: exact G.711, strict payload checks, click-free streaming output."""

from __future__ import annotations

import base64
import math
import warnings
from types import ModuleType

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_actors.errors import InvalidRequestError
from omni_actors.server import audio_format
from omni_actors.server.audio_format import (
    BETA_FORMATS,
    AudioFormatName,
    AudioPayloadError,
    OutputAudio,
    decode_audio,
    encode_audio,
    format_rate,
)

G711: list[AudioFormatName] = ["audio/pcmu", "audio/pcma"]
ALL: list[AudioFormatName] = ["audio/pcm", *G711]
BIG = 1 << 20


def _audioop() -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # removed in Python 3.13
        return pytest.importorskip("audioop")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _raw(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _every_int16() -> torch.Tensor:
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)


def _le_bytes(samples: torch.Tensor) -> bytes:
    return samples.numpy().astype("<i2").tobytes()


def _oracle(name: AudioFormatName) -> tuple[object, object]:
    audioop = _audioop()
    if name == "audio/pcmu":
        return audioop.lin2ulaw, audioop.ulaw2lin
    return audioop.lin2alaw, audioop.alaw2lin


@pytest.mark.parametrize("name", G711)
def test_g711_encoding_matches_audioop_for_every_sample(name: AudioFormatName) -> None:
    encode, _ = _oracle(name)
    samples = _every_int16()
    assert _raw(encode_audio(samples, name)) == encode(_le_bytes(samples), 2)  # type: ignore[operator]


@pytest.mark.parametrize("name", G711)
def test_g711_decoding_matches_audioop_for_every_code(name: AudioFormatName) -> None:
    _, decode = _oracle(name)
    codes = bytes(range(256))
    decoded = decode_audio(_b64(codes), name, max_bytes=BIG)
    assert decoded.dtype == torch.int16
    assert _le_bytes(decoded) == decode(codes, 2)  # type: ignore[operator]


@pytest.mark.parametrize("name", G711)
def test_float_samples_encode_as_their_rounded_int16(name: AudioFormatName) -> None:
    encode, _ = _oracle(name)
    x = torch.rand(5000, generator=torch.Generator().manual_seed(1)) * 2 - 1
    pcm = torch.from_numpy(np.rint(np.clip(x.numpy() * 32768, -32768, 32767)).astype(np.int16))
    assert _raw(encode_audio(x, name)) == encode(_le_bytes(pcm), 2)  # type: ignore[operator]


@pytest.mark.parametrize("name", G711)
def test_g711_decoded_values_encode_back_to_their_code(name: AudioFormatName) -> None:
    # Holds without audioop: the tables agree with each other on every code.
    levels = decode_audio(_b64(bytes(range(256))), name, max_bytes=BIG)
    again = decode_audio(encode_audio(levels, name), name, max_bytes=BIG)
    assert torch.equal(again, levels)
    # A step of the companding never exceeds its segment's quantum (1/16 of an octave).
    x = _every_int16()
    error = (decode_audio(encode_audio(x, name), name, max_bytes=BIG).int() - x.int()).abs()
    assert int(error.max()) <= 1024
    assert int(error[32768 - 100 : 32768 + 100].max()) <= 16  # fine steps near zero


def test_pcm16_is_little_endian_and_round_trips() -> None:
    assert decode_audio(_b64(b"\x01\x00\xff\x7f\x00\x80"), "audio/pcm", max_bytes=BIG).tolist() == [
        1,
        32767,
        -32768,
    ]
    x = _every_int16()
    assert _raw(encode_audio(x, "audio/pcm")) == _le_bytes(x)
    assert torch.equal(decode_audio(encode_audio(x, "audio/pcm"), "audio/pcm", max_bytes=BIG), x)
    # int16 -> float (the session's /32768) -> int16 is exact.
    as_float = x.to(torch.float32) / 32768.0
    assert torch.equal(
        decode_audio(encode_audio(as_float, "audio/pcm"), "audio/pcm", max_bytes=BIG), x
    )


def test_float_samples_are_clipped_and_nan_is_silence() -> None:
    x = torch.tensor([2.0, -3.0, float("nan"), 1.0, -1.0, 0.5])
    assert decode_audio(encode_audio(x, "audio/pcm"), "audio/pcm", max_bytes=BIG).tolist() == [
        32767,
        -32768,
        0,
        32767,
        -32768,
        16384,
    ]


@pytest.mark.parametrize(
    ("data", "name", "max_bytes", "reason"),
    [
        ("", "audio/pcm", BIG, "empty"),
        ("", "audio/pcmu", BIG, "empty"),
        ("AAA!", "audio/pcm", BIG, "invalid_base64"),
        ("AAAA\n", "audio/pcm", BIG, "invalid_base64"),  # strict: no whitespace
        ("AA", "audio/pcm", BIG, "invalid_base64"),  # missing padding
        ("AAAé", "audio/pcm", BIG, "invalid_base64"),  # not ASCII
        ("AAAA", "audio/pcm", BIG, "odd_length"),  # 3 bytes: one and a half samples
        (_b64(bytes(6)), "audio/pcm", 5, "too_large"),  # caught after decoding
        (_b64(bytes(7)), "audio/pcmu", 6, "too_large"),
        ("!" * 1_000_000, "audio/pcm", 1000, "too_large"),  # caught before decoding
    ],
)
def test_bad_payloads_are_refused_with_a_reason(
    data: str, name: AudioFormatName, max_bytes: int, reason: str
) -> None:
    with pytest.raises(AudioPayloadError) as caught:
        decode_audio(data, name, max_bytes=max_bytes)
    assert caught.value.reason == reason
    assert caught.value.param == "audio"
    assert isinstance(caught.value, InvalidRequestError)
    assert caught.value.code == "invalid_request"
    assert str(caught.value)  # a message for the client


def test_size_limit_is_inclusive_and_g711_takes_odd_counts() -> None:
    assert decode_audio(_b64(bytes(6)), "audio/pcm", max_bytes=6).numel() == 3
    assert decode_audio("AAAA", "audio/pcmu", max_bytes=3).numel() == 3


def test_an_oversized_payload_is_refused_without_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def decode(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("decoded a payload already known to be too large")

    monkeypatch.setattr(audio_format.base64, "b64decode", decode)
    with pytest.raises(AudioPayloadError, match="smaller pieces") as caught:
        decode_audio(_b64(bytes(3000)), "audio/pcm", max_bytes=2000)
    assert caught.value.reason == "too_large"


def test_formats_rates_and_beta_names() -> None:
    assert format_rate("audio/pcm") == 24000
    assert format_rate("audio/pcmu") == 8000
    assert format_rate("audio/pcma") == 8000
    assert BETA_FORMATS == {
        "pcm16": "audio/pcm",
        "g711_ulaw": "audio/pcmu",
        "g711_alaw": "audio/pcma",
    }
    with pytest.raises(ValueError, match="audio/pcm"):
        format_rate("pcm16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown audio format"):
        decode_audio("AAAA", "g711_ulaw", max_bytes=BIG)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown audio format"):
        OutputAudio(24000, "wav")  # type: ignore[arg-type]


def _stream(output: OutputAudio, x: torch.Tensor, sizes: list[int]) -> bytes:
    parts, start = [], 0
    for size in sizes:
        parts.append(output.encode(x[start : start + size]))
        start += size
    parts.append(output.encode(x[start:]))
    parts.append(output.flush())
    return b"".join(_raw(part) for part in parts)


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(ALL),
    source=st.sampled_from([24000, 16000, 22050, 48000]),
    sizes=st.lists(st.integers(0, 300), max_size=10),
)
def test_streamed_output_equals_one_shot(
    name: AudioFormatName, source: int, sizes: list[int]
) -> None:
    x = torch.rand(source // 20, generator=torch.Generator().manual_seed(source)) * 1.8 - 0.9
    once = _stream(OutputAudio(source, name), x, [])
    assert _stream(OutputAudio(source, name), x, sizes) == once
    # The converter keeps nothing across responses' flushes: it can be reused.
    output = OutputAudio(source, name)
    assert _stream(output, x, sizes) == _stream(output, x, [])


@pytest.mark.parametrize("name", ALL)
def test_output_is_resampled_to_the_format_rate(name: AudioFormatName) -> None:
    source, hz = 24000, 440.0
    tone = 0.5 * torch.sin(2 * math.pi * hz * torch.arange(source) / source)
    output = OutputAudio(source, name)
    pcm = decode_audio(
        _b64(_raw(output.encode(tone)) + _raw(output.flush() or "")), name, max_bytes=BIG
    )
    rate = format_rate(name)
    assert abs(pcm.numel() - rate) <= 1  # one second stays one second
    spectrum = np.abs(np.fft.rfft(pcm.numpy().astype(np.float64)))
    peak_hz = int(np.argmax(spectrum)) * rate / pcm.numel()
    assert abs(peak_hz - hz) <= 2  # the pitch is kept


def test_output_at_the_format_rate_passes_straight_through() -> None:
    x = torch.rand(480, generator=torch.Generator().manual_seed(3)) * 2 - 1
    output = OutputAudio(24000, "audio/pcm")
    assert output.encode(x) == encode_audio(x, "audio/pcm")
    assert output.flush() == ""
    assert output.encode(torch.zeros(0)) == ""
