"""``StreamResampler``: audio sent in pieces, resampled as one stream.

A caller may send audio at its own rate (the OpenAI Realtime API's PCM is 24 kHz, a
browser's often 48 kHz) to an entry stage that takes another (16 kHz for Qwen3-Omni's
audio encoder). Resampling each piece on its own would click at every boundary, so
this keeps the tail of the input between pieces: the output of a stream sent in pieces
equals the output of the same stream sent at once (up to float rounding), and
:meth:`StreamResampler.flush` ends the stream (the last samples need the zeros after
them).

The filter is a windowed sinc (Hann window, ``taps`` zero crossings each side), with
its cutoff at the lower Nyquist frequency of the two rates, so downsampling does not
alias. Integer rates make it polyphase: output ``j`` sits at input ``j * p / q`` (the
ratio in lowest terms), so its filter depends only on ``j * p mod q``; the ``q`` filters
are computed once per stream, and each output is a gather and a dot product (a 20 ms
frame of 24 kHz costs tens of microseconds, where computing the sinc per output cost
most of a millisecond).
"""

from __future__ import annotations

import math

import torch

from omni_actors.errors import InvalidRequestError

__all__ = ["CALLER_RATES", "CallerAudio", "StreamResampler"]

CALLER_RATES = range(8_000, 192_001)
"""The sample rates a caller's audio may come at (telephony's 8 kHz to studio 192 kHz):
outside them the resampler's filters (one per output phase, as wide as the rate ratio)
would grow without bound for a rate that no microphone produces."""


class StreamResampler:
    """Resamples one stream from ``source`` Hz to ``target`` Hz (mono float32).

    Args:
        source: the caller's sample rate.
        target: the rate the pipeline's entry stage takes.
        taps: zero crossings of the sinc kept on each side (quality against cost).
    """

    def __init__(self, source: int, target: int, taps: int = 16) -> None:
        if source <= 0 or target <= 0:
            raise ValueError(f"sample rates must be positive, got {source} and {target}")
        self.source = source
        self.target = target
        self.taps = taps
        self._step = source / target  # input samples per output sample
        self._cutoff = min(1.0, target / source)
        self._half = math.ceil(taps / self._cutoff)  # input samples each side
        common = math.gcd(source, target)
        self._p, self._q = source // common, target // common  # step = p / q
        self._offsets = torch.arange(-self._half + 1, self._half + 1)
        self._phases = self._filters()
        self._reset()

    def _filters(self) -> torch.Tensor:
        """[q, 2*half]: the filter of an output at fractional input position r / q."""
        fraction = torch.arange(self._q, dtype=torch.float64) / self._q
        distance = fraction[:, None] - self._offsets[None, :].to(torch.float64)
        window = 0.5 + 0.5 * torch.cos(math.pi * distance / self._half)
        return (self._cutoff * torch.sinc(distance * self._cutoff) * window).to(torch.float32)

    def _reset(self) -> None:
        self._pending = torch.zeros(self._half)  # input from index ``_start`` on
        self._start = -self._half  # stream index of _pending[0]: leading zeros
        self._next = 0  # index of the next output sample

    def push(self, audio: torch.Tensor) -> torch.Tensor:
        """The output samples that ``audio`` (1-D) completes."""
        self._pending = torch.cat((self._pending, audio.reshape(-1).to(torch.float32)))
        return self._emit(final=False)

    def flush(self) -> torch.Tensor:
        """The rest of the stream (the input after it taken as silence); then it restarts."""
        end = self._start + self._pending.numel()
        self._pending = torch.cat((self._pending, torch.zeros(self._half + 1)))
        out = self._emit(final=True, end=end)
        self._reset()
        return out

    def _emit(self, *, final: bool, end: int | None = None) -> torch.Tensor:
        available = self._start + self._pending.numel()  # stream index past the input
        if final:
            assert end is not None
            count = max(0, math.ceil(end / self._step) - self._next)
        else:
            # Output j needs the input up to floor(j * step) + half.
            count = max(0, math.floor((available - 1 - self._half) / self._step) + 1 - self._next)
        if count == 0:
            return torch.zeros(0)
        position = (self._next + torch.arange(count)) * self._p  # times q, exact
        base = torch.div(position, self._q, rounding_mode="floor")
        index = base[:, None] + self._offsets[None, :]  # [count, 2*half] stream indices
        weights = self._phases[position - base * self._q]
        out = (self._pending[index - self._start] * weights).sum(dim=1)
        self._next += count
        # Keep what later outputs still need.
        keep_from = math.floor(self._next * self._step) - self._half + 1
        drop = max(0, keep_from - self._start)
        self._pending = self._pending[drop:]
        self._start += drop
        return out


class CallerAudio:
    """A session's audio input: checked, made float32, resampled to ``rate`` as one stream.

    Args:
        rate: the pipeline's input rate (``inputs.sample_rate``).
    """

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._resampler: StreamResampler | None = None  # audio at the caller's own rate

    def take(self, audio: torch.Tensor, sample_rate: int | None) -> torch.Tensor:
        """``audio`` (float or int16, mono) as float32 samples at ``rate``: what is ready.

        Numpy arrays and PCM16 bytes are made tensors before this
        (:func:`~omni_actors.audio.samples.audio_tensor`).

        Raises:
            InvalidRequestError: not a 1-D float or int16 tensor, a sample that is NaN or
                infinite, or a ``sample_rate`` outside :data:`CALLER_RATES`.
        """
        if not isinstance(audio, torch.Tensor) or (
            audio.dim() != 1 and audio.numel() != max(audio.shape, default=0)
        ):
            shape = tuple(audio.shape) if isinstance(audio, torch.Tensor) else None
            raise InvalidRequestError(f"audio must be 1-D (mono samples), got shape {shape}")
        if audio.dtype == torch.int16:
            audio = audio.to(torch.float32) / 32768.0
        elif not audio.is_floating_point():
            raise InvalidRequestError(f"audio must be float or int16 samples, not {audio.dtype}")
        audio = audio.reshape(-1).to(torch.float32)
        # A NaN would spread through the resampler and every later frame of the stream.
        if audio.numel() and not bool(torch.isfinite(audio).all()):
            raise InvalidRequestError("audio has NaN or infinite samples")
        if sample_rate is None or sample_rate == self.rate:
            return audio
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int):
            raise InvalidRequestError(f"sample_rate must be an int, got {sample_rate!r}")
        if sample_rate not in CALLER_RATES:
            raise InvalidRequestError(
                f"sample_rate {sample_rate} Hz is not one a session takes "
                f"({CALLER_RATES.start} to {CALLER_RATES.stop - 1} Hz)"
            )
        if self._resampler is None or self._resampler.source != sample_rate:
            self._resampler = StreamResampler(sample_rate, self.rate)
        return self._resampler.push(audio)

    def flush(self) -> torch.Tensor:
        """The end of the resampled stream (a turn boundary); empty if none is open."""
        resampler, self._resampler = self._resampler, None
        return resampler.flush() if resampler is not None else torch.zeros(0)

    def drop(self) -> None:
        """Forget what the resampler holds (the input was cleared)."""
        self._resampler = None
