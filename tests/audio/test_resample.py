"""``StreamResampler``: pieces resample as one stream, at the right pitch and length."""

from __future__ import annotations

import math

import pytest
import torch

from omni_actors.audio.resample import StreamResampler


def tone(hz: float, rate: int, seconds: float = 1.0) -> torch.Tensor:
    return torch.sin(2 * math.pi * hz * torch.arange(int(rate * seconds)) / rate)


@pytest.mark.parametrize(("source", "target"), [(24000, 16000), (48000, 16000), (8000, 16000)])
def test_pieces_equal_one_stream(source: int, target: int) -> None:
    x = torch.randn(source, generator=torch.Generator().manual_seed(0))
    whole = StreamResampler(source, target)
    once = torch.cat((whole.push(x), whole.flush()))
    pieces = StreamResampler(source, target)
    sizes = [1, 7, 480, 3, 5000] * 100
    parts, start = [], 0
    for size in sizes:
        parts.append(pieces.push(x[start : start + size]))
        start += size
        if start >= x.numel():
            break
    parts.append(pieces.push(x[start:]))
    streamed = torch.cat((*parts, pieces.flush()))
    assert once.numel() == streamed.numel() == target
    assert torch.allclose(once, streamed, atol=1e-5)


def test_a_tone_keeps_its_pitch_and_downsampling_does_not_alias() -> None:
    r = StreamResampler(48000, 16000)
    y = torch.cat((r.push(tone(1000, 48000)), r.flush()))
    assert torch.allclose(y[200:-200], tone(1000, 16000)[200:-200], atol=2e-3)
    # 12 kHz is above the 8 kHz Nyquist of the target: it must be filtered, not folded.
    r = StreamResampler(48000, 16000)
    folded = torch.cat((r.push(tone(12000, 48000)), r.flush()))
    assert folded[200:-200].abs().max() < 0.02


def test_flush_restarts_the_stream_and_bad_rates_are_refused() -> None:
    r = StreamResampler(24000, 16000)
    first = torch.cat((r.push(tone(440, 24000)), r.flush()))
    again = torch.cat((r.push(tone(440, 24000)), r.flush()))
    assert torch.equal(first, again)
    with pytest.raises(ValueError, match="positive"):
        StreamResampler(0, 16000)
