"""``ServerVad``: the realtime server's turn detection (``turn_detection``).

The input is cut into frames at fixed positions of the stream, and a :class:`Voicing`
judges each frame voiced or not: Silero VAD's speech probability reaching
``threshold`` (``turn_models.SileroVoicing``, when installed), else the frame's energy
(:class:`EnergyVoicing`). Speech starts after ``min_speech_ms`` of consecutive voiced
frames (so a click, a cough or a keyboard tap does not start a turn) and stops after
``silence_duration_ms`` of consecutive unvoiced frames (so a pause between words does
not end it). With an :class:`EndOfTurn` judge (``semantic_vad``), that pause only asks
the judge whether the user finished; if not, the turn goes on until speech resumes or
the silence lasts ``max_silence_ms``.

The energy fallback cuts 10 ms frames; ``threshold`` (0..1, OpenAI's default 0.5) maps
linearly onto a level in dBFS (RMS, 0 dBFS = a full-scale square wave)::

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
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "EndOfTurn",
    "EnergyVoicing",
    "ServerVad",
    "SpeechStarted",
    "SpeechStopped",
    "VadEvent",
    "Voicing",
    "threshold_dbfs",
]

FRAME_MS = 10
"""Length of the frames the energy fallback measures (speech VADs use 10-30 ms)."""

Samples = npt.NDArray[np.float64]


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


class Voicing(Protocol):
    """Judges frames of the input (``frame`` samples each, in stream order) voiced."""

    @property
    def frame(self) -> int:
        """Samples per frame, at the input's rate."""
        ...

    def voiced(self, frames: Samples) -> npt.NDArray[np.bool_]:
        """One verdict per row of ``frames`` (shape ``(n, frame)``, floats in [-1, 1])."""
        ...


class EndOfTurn(Protocol):
    """Judges, at a pause, whether the user finished their turn (``semantic_vad``)."""

    def heard(self, samples: Samples) -> None:
        """Take the next samples of the input (every one, in order)."""
        ...

    def complete(self, start: int, end: int) -> bool:
        """Whether the speech from sample ``start`` to ``end`` (of the whole input) ends
        a turn."""
        ...


def threshold_dbfs(threshold: float) -> float:
    """The frame level (RMS dBFS) that ``threshold`` (0..1) stands for."""
    return -70.0 + 60.0 * threshold


class EnergyVoicing:
    """A 10 ms frame is voiced when its RMS level reaches ``threshold_dbfs(threshold)``."""

    def __init__(self, sample_rate: int, threshold: float) -> None:
        self.frame = max(1, round(sample_rate * FRAME_MS / 1000))
        # Compared in the linear domain: no log per frame.
        self._power = 10.0 ** (threshold_dbfs(threshold) / 10.0)

    def voiced(self, frames: Samples) -> npt.NDArray[np.bool_]:
        """Whether each frame's mean square reaches the threshold's power."""
        power = np.einsum("ij,ij->i", frames, frames) / frames.shape[1]
        return power >= self._power  # type: ignore[no-any-return]


class ServerVad:
    """Detects the start and end of speech in one session's input audio.

    Args:
        sample_rate: the rate of the samples given to :meth:`feed`.
        threshold: 0..1; higher needs louder audio (see the module's docstring).
        prefix_padding_ms: audio before the detected start that belongs to the turn.
        silence_duration_ms: silence that ends speech (with ``end_of_turn``: the pause
            after which it is asked).
        min_speech_ms: voiced audio needed to start speech (shorter bursts are noise).
        voicing: judges frames voiced; None: :class:`EnergyVoicing` at ``threshold``.
        end_of_turn: asked at each pause whether the turn ended; None: every pause of
            ``silence_duration_ms`` ends it.
        max_silence_ms: with ``end_of_turn``, the silence that ends a turn it judged
            unfinished.

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
        voicing: Voicing | None = None,
        end_of_turn: EndOfTurn | None = None,
        max_silence_ms: int | None = None,
    ) -> None:
        _check_int("sample_rate", sample_rate, low=100)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ValueError(f"threshold must be a number in 0.0..1.0, got {threshold!r}")
        if not 0.0 <= threshold <= 1.0:  # also refuses NaN
            raise ValueError(f"threshold must be in 0.0..1.0, got {threshold!r}")
        _check_int("prefix_padding_ms", prefix_padding_ms, low=0)
        _check_int("silence_duration_ms", silence_duration_ms, low=1)
        _check_int("min_speech_ms", min_speech_ms, low=0)
        max_silence_ms = silence_duration_ms if max_silence_ms is None else max_silence_ms
        _check_int("max_silence_ms", max_silence_ms, low=silence_duration_ms)
        self.sample_rate = sample_rate
        self.threshold = float(threshold)
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self.min_speech_ms = min_speech_ms
        self.max_silence_ms = max_silence_ms
        self.voicing: Voicing = voicing or EnergyVoicing(sample_rate, self.threshold)
        self.end_of_turn = end_of_turn
        self._frame = self.voicing.frame
        self._start_frames = self._frames_for(min_speech_ms)
        self._stop_frames = self._frames_for(silence_duration_ms)
        self._max_frames = self._frames_for(max_silence_ms)
        self._rest = np.zeros(0, dtype=np.float64)  # the start of a frame not yet whole
        self._frames = 0  # whole frames seen since the start
        self.reset()

    def _frames_for(self, ms: int) -> int:
        return max(1, math.ceil(ms * self.sample_rate / 1000 / self._frame))

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
        self._speech_start = 0  # sample index where the speech in progress began
        self._asked = False  # the end-of-turn judge was asked during this pause

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
        if self.end_of_turn is not None:
            self.end_of_turn.heard(new)
        stream = np.concatenate((self._rest, new)) if self._rest.size else new
        whole = stream.size // self._frame
        self._rest = stream[whole * self._frame :].copy()
        if whole == 0:
            return []
        frames = stream[: whole * self._frame].reshape(whole, self._frame)
        return self._advance(self.voicing.voiced(frames))

    def _advance(self, voiced: npt.NDArray[np.bool_]) -> list[VadEvent]:
        # One step per frame (not per sample): 30-100 steps a second of audio.
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
                self._asked = False
                continue
            if not self._speaking and self._run >= self._start_frames:
                self._speaking, self._run = True, 0
                self._speech_start = self._run_start
                start = self._ms(self._run_start) - self.prefix_padding_ms
                events.append(SpeechStarted(audio_start_ms=max(0, start)))
            elif self._speaking and self._run >= self._stop_frames:
                silence = self._silence_ending_turn(end=(frame + 1) * self._frame)
                if silence is None:
                    continue
                self._speaking, self._run, self._asked = False, 0, False
                events.append(SpeechStopped(audio_end_ms=self._ms(self._run_start) + silence))
        return events

    def _silence_ending_turn(self, end: int) -> int | None:
        """The silence (ms) after which the pause reaching sample ``end`` ends the turn;
        None while it does not."""
        if self.end_of_turn is None:
            return self.silence_duration_ms
        if self._run >= self._max_frames:
            return self.max_silence_ms
        if self._asked:
            return None
        # Asked once a pause: the audio barely changes while the silence goes on.
        self._asked = True
        if self.end_of_turn.complete(self._speech_start, end):
            return self.silence_duration_ms
        return None

    def _ms(self, sample: int) -> int:
        return sample * 1000 // self.sample_rate


def _check_int(name: str, value: object, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
