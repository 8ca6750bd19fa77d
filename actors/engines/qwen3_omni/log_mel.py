"""``LogMel``: tiny-omni's log-mel front end, computed while the audio arrives.

It is Whisper's front end (``WhisperFeatureExtractor``: a centred STFT with reflect
padding, 25 ms Hann windows every 10 ms, power spectrum, 128 mel bins, ``log10``) made
*streaming-exact*: pushing a clip in pieces of any size gives the same frames, bit for
bit, as pushing it at once. Two things make that so:

- Frames are computed in fixed blocks (``block`` frames, aligned to the clip's start),
  each from exactly the samples it covers, so a block is the same computation whatever
  arrived with it. A frame is final once the samples under its window arrived (the STFT
  needs 240 samples of lookahead past a frame's hop); only the last frames of the clip,
  whose windows reach past its end, wait for :meth:`LogMel.finish` and its reflect
  padding.
- **The one deviation from Whisper**: Whisper floors every value at the *clip's*
  maximum minus 8 (80 dB of range), which is only known once the clip ended. Here the
  floor is the maximum *so far* minus 8: frame ``t`` is floored at ``max(log_mel[:, :t+1])
  - 8``. Whisper's features are unchanged from the loudest frame on (real speech peaks
  early), the floor still follows the input's level (scaling the input shifts values and
  floor together, as in Whisper), and no frame waits for the end of the clip. A floor at
  a fixed level would be streamable too, but would break that scale invariance.

With the global floor, a streaming thinker would have to re-encode (and re-prefill)
everything heard so far whenever a louder frame arrived; with the running one, the time
from the end of input to the first token does not grow with the input's length.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import torch

from omni_actors.actors.engines.qwen3_omni.hf import WhisperFeatureExtractor

__all__ = ["DYNAMIC_RANGE", "LogMel"]


def _on_host(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Run ``fn`` with CPU factory defaults: log-mel is host math, even when it is
    called from an engine thread whose default device is a GPU."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.device("cpu"):
            return fn(*args, **kwargs)

    return wrapper


DYNAMIC_RANGE: Final = 8.0
"""Whisper's floor below the peak, in ``log10`` units (80 dB)."""

Samples = np.ndarray[Any, np.dtype[np.float32]]


class LogMel:
    """One clip's normalised log-mel frames, produced as its samples are pushed.

    Frame ``t`` covers samples ``[hop*t - n_fft/2, hop*t + n_fft/2)``; a clip of ``n``
    samples has ``n // hop`` frames, as Whisper's (which drops the STFT's last frame).

    Args:
        extractor: the Whisper front end whose parameters (FFT size, hop, mel filters)
            this computes with.
        block: frames computed together (see the module docstring); the thinker uses
            the audio encoder's conv chunk, so a block is never split between encoder
            windows.
    """

    def __init__(self, extractor: WhisperFeatureExtractor, block: int) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1 frame, got {block}")
        self.n_fft = int(extractor.n_fft)
        self.hop = int(extractor.hop_length)
        self.block = block
        self._pad = self.n_fft // 2
        self._window = torch.hann_window(self.n_fft)
        self._filters = torch.from_numpy(np.asarray(extractor.mel_filters)).to(torch.float32).T
        self._kept: Samples = np.zeros(0, dtype=np.float32)
        self._arrived: list[Samples] = []
        """Pushed since the last computation: joined onto ``_kept`` once, when needed
        (a 20 ms frame at a time, joining on every push would copy quadratically)."""
        self._kept_from = 0
        """Clip index of ``_kept[0]``: what frames not yet computed may still need."""
        self._head: Samples = np.zeros(0, dtype=np.float32)
        """The clip's first ``n_fft/2 + 1`` samples, for the left reflect padding."""
        self._received = 0
        self._frames = 0
        self._peak = float("-inf")
        self._finished = False

    @property
    def received(self) -> int:
        """Samples pushed so far."""
        return self._received

    @property
    def frames(self) -> int:
        """Frames produced so far."""
        return self._frames

    def ready(self) -> int:
        """How many frames :meth:`take` would produce now (whole blocks only)."""
        if self._received <= self._pad:
            return 0
        # Frame t is final once sample hop*t + n_fft/2 arrived (frame 0's reflect padding
        # reads sample n_fft/2 too).
        final = (self._received - self._pad - 1) // self.hop + 1
        return max(0, final - self._frames) // self.block * self.block

    def push(self, samples: Samples) -> None:
        """Append samples (float32, mono, 16 kHz); cheap: the work happens in :meth:`take`."""
        if self._finished:
            raise ValueError("the clip is finished; start a new LogMel")
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if len(self._head) <= self._pad:
            self._head = np.concatenate((self._head, samples[: self._pad + 1 - len(self._head)]))
        self._arrived.append(samples)
        self._received += len(samples)

    @_on_host
    def take(self) -> torch.Tensor:
        """The frames that are final now, in whole blocks: [n_mels, k] float32 (k may be 0)."""
        return self._compute(self.ready())

    @_on_host
    def finish(self) -> torch.Tensor:
        """Every frame not produced yet, the last ones reflect-padded past the clip's end.

        Raises:
            ValueError: the clip is too short for reflect padding (``n_fft/2`` samples
                or fewer; Whisper fails on such clips too).
        """
        self._finished = True
        total = self._received // self.hop
        if total <= self._frames:
            return torch.zeros(self._filters.shape[0], 0)
        if self._received <= self._pad:
            raise ValueError(f"a clip of {self._received} samples is too short for a log-mel")
        return self._compute(total - self._frames)

    def _compute(self, count: int) -> torch.Tensor:
        if count > 0 and self._arrived:
            self._kept = np.concatenate((self._kept, *self._arrived))
            self._arrived = []
        pieces: list[torch.Tensor] = []
        while count > 0:
            frames = min(self.block, count)
            pieces.append(self._block(self._frames, frames))
            self._frames += frames
            count -= frames
        self._drop_consumed()
        if not pieces:
            return torch.zeros(self._filters.shape[0], 0)
        return torch.cat(pieces, dim=1)

    def _block(self, first: int, frames: int) -> torch.Tensor:
        """Normalised frames ``first .. first+frames-1`` from exactly the samples they cover."""
        start = first * self.hop - self._pad
        stop = (first + frames - 1) * self.hop + self._pad  # exclusive
        segment = self._samples(start, stop)
        spectrum = torch.stft(
            torch.from_numpy(segment),
            self.n_fft,
            self.hop,
            window=self._window,
            center=False,
            return_complex=True,
        )
        power = spectrum.abs() ** 2
        log_mel = (self._filters @ power).clamp(min=1e-10).log10()
        peaks = torch.cummax(log_mel.amax(dim=0), dim=0).values.clamp(min=self._peak)
        self._peak = float(peaks[-1])
        return (torch.maximum(log_mel, peaks - DYNAMIC_RANGE) + 4.0) / 4.0

    def _samples(self, start: int, stop: int) -> Samples:
        """Clip samples ``start .. stop-1``, reflected at the clip's two edges (the right
        edge is only reached by :meth:`finish`: :meth:`ready` counts frames inside)."""
        index = np.arange(start, stop)
        index = np.where(index < 0, -index, index)  # x[-k] = x[k]
        last = self._received - 1
        index = np.where(index > last, 2 * last - index, index)  # x[n-1+k] = x[n-1-k]
        head = index < self._kept_from
        out = np.empty(len(index), dtype=np.float32)
        out[head] = self._head[index[head]]
        out[~head] = self._kept[index[~head] - self._kept_from]
        return out

    def _drop_consumed(self) -> None:
        """Forget samples no frame still to come covers (memory stays bounded)."""
        needed = max(0, self._frames * self.hop - self._pad)
        if needed > self._kept_from:
            self._kept = self._kept[needed - self._kept_from :]
            self._kept_from = needed
