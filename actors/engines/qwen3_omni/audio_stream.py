"""``AudioClip``: one clip of streamed audio, encoded window by window as it arrives.

Qwen3-Omni's audio encoder (``Qwen3OmniMoeAudioEncoder``) cuts a clip's log-mel into
*chunks* of ``2 * n_window`` frames, runs each through three stride-2 convolutions
(positions restart in every chunk), and then attends only within *windows* of
``n_window_infer`` frames, counted from the clip's start. So the encoder's output for a
clip is the concatenation of its outputs for each window encoded alone: a window's
embeddings are final as soon as its last frame is, and only the last, partial window
has to wait for the end of the clip. That is what :class:`AudioClip` does, which makes
the work left at the end of input bounded by one window (8 s of audio), whatever the
clip's length. The windowing itself is :class:`MelWindows`, which the vLLM thinker
shares (it sends each window to vLLM as it becomes whole).

One detail keeps it exact: the encoder pads every chunk of a call to the call's longest
chunk, and the padding reaches the last valid embedding of a shorter chunk through the
convolutions' receptive field (measured: 3e-6 on tiny-omni). Whole windows hold whole
chunks only, so nothing is padded; a last window shorter than one chunk is padded to a
whole chunk in the one-shot encoding of a longer clip, so it is encoded behind the
window before it (whose own embeddings, computed again, are dropped). Streamed output
then equals the one-shot ``get_audio_features`` of the whole clip up to float rounding
(``tests/integration/test_tiny_omni_thinker_audio.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import torch

from omni_actors.actors.engines.qwen3_omni.log_mel import LogMel, Samples
from omni_actors.actors.engines.qwen3_omni.stepping import audio_token_count

__all__ = ["MIN_SAMPLES", "AudioClip", "Encode", "MelWindows"]

MIN_SAMPLES: Final = 400
"""One 25 ms STFT window; shorter clips are dropped (nothing to hear, and the mel front
end's reflect padding fails on the shortest)."""

Encode = Callable[[torch.Tensor], torch.Tensor]
"""The audio encoder: log-mel [n_mels, frames] of one call -> embeddings [tokens, H]."""


class MelWindows:
    """A clip's log-mel cut into the audio encoder's attention windows as samples arrive.

    The windowing both thinkers share: :class:`AudioClip` encodes each window here, the
    vLLM thinker sends each one to vLLM as an audio item of its own.

    Args:
        mel: the clip's log-mel front end (its ``block`` must be the encoder's chunk).
        n_window: the encoder's ``n_window`` (chunks of ``2 * n_window`` frames).
        n_window_infer: the encoder's attention window in frames, a whole number of
            chunks.

    Raises:
        ValueError: the block is not the chunk, or the window not whole chunks.
    """

    def __init__(self, mel: LogMel, n_window: int, n_window_infer: int) -> None:
        chunk = 2 * n_window
        if mel.block != chunk or n_window_infer % chunk:
            raise ValueError(
                f"the log-mel block ({mel.block}) must be the encoder chunk ({chunk}) and "
                f"the attention window ({n_window_infer}) a whole number of chunks"
            )
        self._mel = mel
        self.chunk = chunk
        """Frames of one encoder chunk."""
        self.window = n_window_infer
        """Frames of one attention window."""
        self.window_tokens = audio_token_count(n_window_infer, n_window)
        """Encoder outputs of one whole window."""
        self._frames: list[torch.Tensor] = []
        """Log-mel frames of the window being filled."""
        self._held = 0
        self.last: torch.Tensor | None = None
        """The last whole window's log-mel (None before the first)."""

    @property
    def samples(self) -> int:
        """Samples pushed so far."""
        return self._mel.received

    def push(self, samples: Samples) -> None:
        """Append samples (float32, mono, 16 kHz); cheap: the work is in :meth:`whole`."""
        self._mel.push(samples)

    def ready(self) -> bool:
        """Whether :meth:`whole` has work: a log-mel block became final.

        Computing each block as it becomes final (every ``2 * n_window`` frames, one
        second) leaves only the last one to compute when the clip ends; a window is
        whole once its last block is in.
        """
        return self._mel.ready() > 0

    def whole(self) -> list[torch.Tensor]:
        """The log-mel [n_mels, window] of every window that became whole since the last
        call (often none)."""
        self._hold(self._mel.take())
        out: list[torch.Tensor] = []
        while self._held >= self.window:
            mel = torch.cat(self._frames, dim=1)
            window, rest = mel[:, : self.window], mel[:, self.window :]
            self._frames, self._held = [rest], rest.shape[1]
            self.last = window
            out.append(window)
        return out

    def rest(self) -> torch.Tensor | None:
        """The clip having ended: the log-mel after its last whole window (call
        :meth:`whole` first), or None if there is none."""
        self._hold(self._mel.finish())
        if self._held == 0:
            return None
        tail = torch.cat(self._frames, dim=1)
        self._frames, self._held = [], 0
        return tail

    def _hold(self, frames: torch.Tensor) -> None:
        if frames.shape[1]:
            self._frames.append(frames)
            self._held += frames.shape[1]


class AudioClip:
    """A clip's samples in, audio-encoder embeddings out, one encoder window at a time.

    Feeding is cheap (:meth:`push` only buffers); :meth:`windows` and :meth:`finish`
    compute, in the model's thread.

    Args:
        mel: the clip's log-mel front end (its ``block`` must be the encoder's chunk).
        n_window: the encoder's ``n_window`` (chunks of ``2 * n_window`` frames).
        n_window_infer: the encoder's attention window in frames, a whole number of
            chunks.
    """

    def __init__(self, mel: LogMel, n_window: int, n_window_infer: int) -> None:
        self._windows = MelWindows(mel, n_window, n_window_infer)
        self.tokens = 0
        """Embeddings produced so far."""

    @property
    def samples(self) -> int:
        """Samples pushed so far."""
        return self._windows.samples

    def push(self, samples: Samples) -> None:
        """Append samples (float32, mono, 16 kHz)."""
        self._windows.push(samples)

    def ready(self) -> bool:
        """Whether :meth:`windows` has work (:meth:`MelWindows.ready`)."""
        return self._windows.ready()

    def windows(self, encode: Encode) -> torch.Tensor | None:
        """Embeddings [tokens, H] of every window that became whole, or None."""
        out = [encode(window) for window in self._windows.whole()]
        return self._count(torch.cat(out)) if out else None

    def finish(self, encode: Encode) -> torch.Tensor | None:
        """Embeddings of what is left, the clip having ended (None if there are none:
        nothing left, or a clip too short to hear)."""
        windows = self._windows
        if self.tokens == 0 and windows.samples < MIN_SAMPLES:
            return None
        whole = self.windows(encode)
        tail = windows.rest()
        if tail is None:
            return whole
        if tail.shape[1] >= windows.chunk or windows.last is None:
            encoded = encode(tail)
        else:
            encoded = encode(torch.cat((windows.last, tail), dim=1))[windows.window_tokens :]
        last = self._count(encoded)
        return last if whole is None else torch.cat((whole, last))

    def _count(self, embeds: torch.Tensor) -> torch.Tensor:
        self.tokens += embeds.shape[0]
        return embeds
