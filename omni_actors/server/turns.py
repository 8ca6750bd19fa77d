"""``TurnDetector``: server VAD in front of the pipeline's input.

``server_vad`` runs Silero VAD when installed (else the frame-energy VAD), and
``semantic_vad`` adds Smart Turn at each pause (``turn_models``, :data:`EAGERNESS`).
With either, the pipeline hears only speech: audio before speech starts is held
(the last ``prefix_padding_ms`` of it goes in with the speech, as OpenAI's committed
items include it), audio while the user speaks goes on as it arrives — so the thinker
prefills while the user is still talking — and speech stopping ends the turn. Silence
between turns costs the pipeline nothing.

With ``idle_timeout_ms``, a reply's end (plus the time its audio takes to play) starts
a wait counted in input audio: that long with no speech, the silence heard last goes on
as the turn (:class:`TimedOut`), so the model can prompt a user who fell quiet. Input
audio, not the wall clock, measures it: a client streams its microphone in real time,
and a test needs no clock to move.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from omni_actors.server.session_config import Eagerness, VadSettings
from omni_actors.server.turn_models import SileroVoicing, SmartTurn, silero_model, smart_turn_model
from omni_actors.server.vad import ServerVad, SpeechStarted, SpeechStopped

__all__ = [
    "EAGERNESS",
    "Forward",
    "Patience",
    "Started",
    "Stopped",
    "TimedOut",
    "TurnAction",
    "TurnDetector",
    "server_vad",
]

_HOLD_EXTRA_MS = 2000  # held beyond the prefix: a VAD may report a start late


@dataclass(frozen=True, slots=True)
class Patience:
    """How ``semantic_vad`` waits at a pause: Smart Turn is asked after ``pause_ms`` of
    silence; a probability of a finished turn from ``threshold`` on ends it, else the
    turn ends only after ``max_silence_ms`` of silence."""

    pause_ms: int
    threshold: float
    max_silence_ms: int


EAGERNESS: dict[Eagerness, Patience] = {
    # OpenAI: low waits longer for the user to go on, high answers sooner; their
    # longest waits are 8, 4 and 2 s; auto is medium.
    "low": Patience(pause_ms=600, threshold=0.7, max_silence_ms=8000),
    "medium": Patience(pause_ms=300, threshold=0.5, max_silence_ms=4000),
    "high": Patience(pause_ms=200, threshold=0.3, max_silence_ms=2000),
    "auto": Patience(pause_ms=300, threshold=0.5, max_silence_ms=4000),
}
"""``semantic_vad``'s eagerness, as pauses and Smart Turn's threshold."""
_SEMANTIC_SPEECH_THRESHOLD = 0.5  # Silero's own default: semantic_vad takes no threshold
_SEMANTIC_PREFIX_MS = 300  # OpenAI's server_vad default


def server_vad(settings: VadSettings, sample_rate: int) -> ServerVad:
    """The VAD a session's settings ask for: Silero (with Smart Turn for
    ``semantic_vad``) when installed, else the frame-energy VAD.

    Raises:
        RuntimeError: ``semantic_vad`` without Smart Turn installed (the settings
            refuse it first).
    """
    silero = silero_model()
    if settings.type == "semantic_vad":
        turn = smart_turn_model()
        if silero is None or turn is None:
            raise RuntimeError("semantic_vad needs the semantic-vad extra installed")
        patience = EAGERNESS[settings.eagerness]
        return ServerVad(
            sample_rate=sample_rate,
            threshold=_SEMANTIC_SPEECH_THRESHOLD,
            prefix_padding_ms=_SEMANTIC_PREFIX_MS,
            silence_duration_ms=patience.pause_ms,
            voicing=SileroVoicing(silero, sample_rate, _SEMANTIC_SPEECH_THRESHOLD),
            end_of_turn=SmartTurn(turn, sample_rate, patience.threshold),
            max_silence_ms=patience.max_silence_ms,
        )
    return ServerVad(
        sample_rate=sample_rate,
        threshold=settings.threshold,
        prefix_padding_ms=settings.prefix_padding_ms,
        silence_duration_ms=settings.silence_duration_ms,
        voicing=None if silero is None else SileroVoicing(silero, sample_rate, settings.threshold),
    )


@dataclass(frozen=True, slots=True)
class Forward:
    """Send these samples to the pipeline."""

    samples: torch.Tensor


@dataclass(frozen=True, slots=True)
class Started:
    """Speech began at ``audio_start_ms`` (prefix padding included)."""

    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class Stopped:
    """Speech ended at ``audio_end_ms``: the turn is over."""

    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class TimedOut:
    """No speech for ``idle_timeout_ms`` since the reply ended (``audio_start_ms``) up
    to ``audio_end_ms``: the silence forwarded before it is the turn."""

    audio_start_ms: int
    audio_end_ms: int


TurnAction = Forward | Started | Stopped | TimedOut


class TurnDetector:
    """Gate a session's input audio by speech (see the module docstring).

    Args:
        settings: the session's ``server_vad`` or ``semantic_vad`` settings.
        sample_rate: the rate of the samples fed.
    """

    def __init__(self, settings: VadSettings, sample_rate: int) -> None:
        self.settings = settings
        self.rate = sample_rate
        self.vad = server_vad(settings, sample_rate)
        # With semantic_vad, feed runs in a worker thread (judges_pauses); the lock keeps
        # the loop's calls (reply_ended, clear) from landing in the middle of it.
        self._lock = threading.Lock()
        self._held: torch.Tensor = torch.zeros(0, dtype=torch.int16)
        self._held_start = 0  # absolute index of the first held sample
        self._keep = (self.vad.prefix_padding_ms + _HOLD_EXTRA_MS) * sample_rate // 1000
        self.speaking = False
        self._idle_from: int | None = None  # sample index the idle wait counts from

    @property
    def fed(self) -> int:
        """Samples fed so far."""
        return self._held_start + self._held.numel()

    @property
    def judges_pauses(self) -> bool:
        """Whether a model judges each pause (``semantic_vad``): :meth:`feed` may then
        take a tenth of a second or more, and is safe to run in a worker thread."""
        return self.vad.end_of_turn is not None

    def reply_ended(self, playback_ms: float) -> None:
        """A reply ended; its audio plays for ``playback_ms`` more: with
        ``idle_timeout_ms``, the idle wait starts when it has played."""
        if self.settings.idle_timeout_ms is not None:
            with self._lock:
                self._idle_from = self.fed + int(playback_ms * self.rate / 1000)

    def feed(self, samples: torch.Tensor) -> list[TurnAction]:
        """What to do with ``samples`` (int16), in order."""
        with self._lock:
            return self._feed(samples)

    def _feed(self, samples: torch.Tensor) -> list[TurnAction]:
        self._held = torch.cat([self._held, samples]) if self._held.numel() else samples
        actions: list[TurnAction] = []
        for event in self.vad.feed(samples):
            if isinstance(event, SpeechStarted):
                self._drop_before(event.audio_start_ms * self.rate // 1000)
                self.speaking = True
                self._idle_from = None
                actions.append(Started(event.audio_start_ms))
            elif isinstance(event, SpeechStopped):
                end = event.audio_end_ms * self.rate // 1000
                actions += self._forward(end - self._held_start)
                self.speaking = False
                self._idle_from = None
                actions.append(Stopped(event.audio_end_ms))
        if self.speaking:
            actions += self._forward(self._held.numel())
        elif self._timed_out():
            assert self._idle_from is not None
            start, end = self._idle_from, self.fed
            self._idle_from = None
            self._drop_before(start)
            actions += self._forward(self._held.numel())
            actions.append(TimedOut(start * 1000 // self.rate, end * 1000 // self.rate))
        else:
            self._drop_before(self._held_start + self._held.numel() - self._keep)
        return actions

    def _timed_out(self) -> bool:
        timeout = self.settings.idle_timeout_ms
        if timeout is None or self._idle_from is None:
            return False
        return self.fed - self._idle_from >= timeout * self.rate // 1000

    def clear(self) -> None:
        """The input buffer was cleared: forget held audio and the speech in progress."""
        with self._lock:
            self._drop_before(self._held_start + self._held.numel())
            self.vad.reset()
            self.speaking = False

    def _forward(self, count: int) -> list[TurnAction]:
        count = max(0, min(count, self._held.numel()))
        if not count:
            return []
        out = self._held[:count]
        self._held = self._held[count:]
        self._held_start += count
        return [Forward(out)]

    def _drop_before(self, index: int) -> None:
        drop = max(0, min(index - self._held_start, self._held.numel()))
        if drop:
            self._held = self._held[drop:]
            self._held_start += drop
