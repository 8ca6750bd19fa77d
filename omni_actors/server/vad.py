"""``ServerVad``: the realtime server's turn detection (``turn_detection: server_vad``).

A frame-energy voice activity detector: the input is cut into 10 ms frames, and a
frame is *voiced* when its RMS level reaches a level set by ``threshold``. Speech
starts after ``min_speech_ms`` of consecutive voiced frames (so a click, a cough or a
keyboard tap does not start a turn) and stops after ``silence_duration_ms`` of
consecutive unvoiced frames (so a pause between words does not end it).

``threshold`` (0..1, OpenAI's default 0.5) maps linearly onto a level in dBFS (RMS,
0 dBFS = a full-scale square wave)::

    level_dbfs = -70 + 60 * threshold      # 0 -> -70, 0.5 -> -40, 1 -> -10 dBFS

Why that range: a quiet room through a laptop or headset microphone sits around
-60..-50 dBFS, and conversational speech around -30..-20 dBFS RMS over its voiced
frames. The default -40 dBFS lies between the two with about 10 dB of margin each
side, and, as OpenAI documents for its own threshold, a higher value needs louder
audio (for noisy rooms), a lower one catches quieter speakers.

Times follow OpenAI's definitions, in ms of all audio fed to this VAD (the session's
input audio; :meth:`ServerVad.reset` keeps counting):

- ``SpeechStarted.audio_start_ms``: where speech began (the start of its first voiced
  frame) minus ``prefix_padding_ms``, floored at 0: "the beginning of audio sent to
  the model, and thus includes the prefix_padding_ms".
- ``SpeechStopped.audio_end_ms``: where the silence that ended speech began plus
  ``silence_duration_ms``: "the end of audio sent to the model, and thus includes the
  silence duration" (the moment the stop is detected, to within a frame).

The events do not depend on how the audio is split into pieces: frames are cut at
fixed positions of the stream and the rest of a piece waits for the next one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["ServerVad", "SpeechStarted", "SpeechStopped", "VadEvent", "threshold_dbfs"]

FRAME_MS = 10
"""Length of the frames the level is measured over (speech VADs use 10-30 ms)."""


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """Speech began (``input_audio_buffer.speech_started``).

    Attributes:
        audio_start_ms: where speech began minus the prefix padding (floored at 0), in
            ms of the VAD's input.
    """

    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """Speech ended (``input_audio_buffer.speech_stopped``).

    Attributes:
        audio_end_ms: where the closing silence began plus ``silence_duration_ms``, in
            ms of the VAD's input.
    """

    audio_end_ms: int


VadEvent = SpeechStarted | SpeechStopped


def threshold_dbfs(threshold: float) -> float:
    """The frame level (RMS dBFS) that ``threshold`` (0..1) stands for."""
    return -70.0 + 60.0 * threshold


class ServerVad:
    """Detects the start and end of speech in one session's input audio.

    Args:
        sample_rate: the rate of the samples given to :meth:`feed`.
        threshold: 0..1; higher needs louder audio (see the module's docstring).
        prefix_padding_ms: audio before the detected start that belongs to the turn.
        silence_duration_ms: silence that ends speech.
        min_speech_ms: voiced audio needed to start speech (shorter bursts are noise).

    Raises:
        ValueError: an argument is out of its range (the message gives the range).
    """

    def __init__(
        self,
        *,
        sample_rate: int,
        threshold: float = 0.5,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
        min_speech_ms: int = 100,
    ) -> None:
        _check_int("sample_rate", sample_rate, low=100)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ValueError(f"threshold must be a number in 0.0..1.0, got {threshold!r}")
        if not 0.0 <= threshold <= 1.0:  # also refuses NaN
            raise ValueError(f"threshold must be in 0.0..1.0, got {threshold!r}")
        _check_int("prefix_padding_ms", prefix_padding_ms, low=0)
        _check_int("silence_duration_ms", silence_duration_ms, low=1)
        _check_int("min_speech_ms", min_speech_ms, low=0)
        self.sample_rate = sample_rate
        self.threshold = float(threshold)
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self.min_speech_ms = min_speech_ms
        self._frame = max(1, round(sample_rate * FRAME_MS / 1000))
        # A frame is voiced when its mean square reaches this power (compared in the
        # linear domain: no log per frame).
        self._power = 10.0 ** (threshold_dbfs(self.threshold) / 10.0)
        self._start_frames = max(1, math.ceil(min_speech_ms * sample_rate / 1000 / self._frame))
        self._stop_frames = max(
            1, math.ceil(silence_duration_ms * sample_rate / 1000 / self._frame)
        )
        self._rest = np.zeros(0, dtype=np.float64)  # the start of a frame not yet whole
        self._frames = 0  # whole frames seen since the start
        self.reset()

    @property
    def speaking(self) -> bool:
        """Whether speech has started and not yet stopped."""
        return self._speaking

    @property
    def audio_ms(self) -> int:
        """Milliseconds of audio fed so far (the time the next sample is at)."""
        return self._ms(self._frames * self._frame + self._rest.size)

    def reset(self) -> None:
        """Forget speech in progress (a commit or a clear); time keeps counting."""
        self._speaking = False
        self._run = 0  # consecutive voiced frames (not speaking) or silent ones (speaking)
        self._run_start = 0  # sample index where that run began

    def feed(self, samples: torch.Tensor) -> list[VadEvent]:
        """Take the next ``samples`` (int16, or float in [-1, 1]); the events they complete.

        Raises:
            ValueError: ``samples`` is neither int16 nor float.
        """
        if samples.dtype == torch.int16:
            scale = 1.0 / 32768.0
        elif samples.is_floating_point():
            scale = 1.0
        else:
            raise ValueError(f"audio must be int16 or float samples, not {samples.dtype}")
        new = samples.detach().reshape(-1).to("cpu", torch.float64).numpy() * scale
        stream = np.concatenate((self._rest, new)) if self._rest.size else new
        whole = stream.size // self._frame
        self._rest = stream[whole * self._frame :].copy()
        if whole == 0:
            return []
        frames = stream[: whole * self._frame].reshape(whole, self._frame)
        power = np.einsum("ij,ij->i", frames, frames) / self._frame
        return self._advance(power >= self._power)

    def _advance(self, voiced: npt.NDArray[np.bool_]) -> list[VadEvent]:
        # One step per 10 ms frame (not per sample): 100 steps a second of audio.
        events: list[VadEvent] = []
        first = self._frames
        self._frames += voiced.size
        for offset, is_voiced in enumerate(voiced.tolist()):
            frame = first + offset
            if is_voiced != self._speaking:  # a frame that counts towards a change
                if self._run == 0:
                    self._run_start = frame * self._frame
                self._run += 1
            else:
                self._run = 0
                continue
            if not self._speaking and self._run >= self._start_frames:
                self._speaking, self._run = True, 0
                start = self._ms(self._run_start) - self.prefix_padding_ms
                events.append(SpeechStarted(audio_start_ms=max(0, start)))
            elif self._speaking and self._run >= self._stop_frames:
                self._speaking, self._run = False, 0
                end = self._ms(self._run_start) + self.silence_duration_ms
                events.append(SpeechStopped(audio_end_ms=end))
        return events

    def _ms(self, sample: int) -> int:
        return sample * 1000 // self.sample_rate


def _check_int(name: str, value: object, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
