"""The models behind turn detection: Silero VAD and Smart Turn, run with onnxruntime.

Both ship inside their wheels (extras ``turns`` and ``semantic-vad``): Silero VAD's
ONNX model in ``silero-vad``, Smart Turn v3.2's in ``pipecat-ai``. They are found
inside the installed packages without importing them (``silero_vad`` sets torch's
thread count when imported, ``pipecat`` pulls in its whole framework), and nothing is
downloaded. Without them the server falls back to the frame-energy VAD for
``server_vad`` and refuses ``semantic_vad``; ``session.created`` says which runs
(``turn_detection.detector``).

- :class:`SileroVoicing` judges 32 ms frames voiced when Silero's speech probability
  reaches ``threshold`` (OpenAI's ``threshold``, on that probability). Silero takes
  16 kHz (512-sample frames) or 8 kHz (256); other rates are resampled per frame.
- :class:`SmartTurn` judges whether the speech so far ends a turn: the last 8 s of it
  at 16 kHz as Whisper log-mel features (``WhisperFeatureExtractor(chunk_length=8)``,
  shorter audio zero-padded in front), one probability out.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "SILERO_VAD",
    "SMART_TURN",
    "SileroVoicing",
    "SmartTurn",
    "silero_model",
    "smart_turn_model",
]

SILERO_VAD = "silero-vad"
"""The name ``turn_detection.detector`` shows while Silero VAD runs."""
SMART_TURN = "silero-vad+smart-turn-v3.2"
"""The name ``turn_detection.detector`` shows for ``semantic_vad``."""

_SILERO_FILE = ("silero_vad", "data", "silero_vad.onnx")
_SMART_TURN_FILE = ("pipecat", "audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")
_TURN_RATE = 16_000
_TURN_SECONDS = 8


def _found(package: str) -> list[str]:
    """Where an installed package's files are, without importing it ([] when absent,
    or blocked with ``sys.modules[package] = None``)."""
    if package in sys.modules:
        module = sys.modules[package]
        return [] if module is None else list(getattr(module, "__path__", []))
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    return [] if spec is None else list(spec.submodule_search_locations or [])


def _shipped(parts: tuple[str, ...], *needs: str) -> Path | None:
    """The file ``parts`` (a package, then the path inside it) when it and the packages
    ``needs`` are installed."""
    if not all(_found(name) for name in needs):
        return None
    for root in _found(parts[0]):
        path = Path(root, *parts[1:])
        if path.is_file():
            return path
    return None


def silero_model() -> Path | None:
    """Silero VAD's ONNX model, when ``silero-vad`` and ``onnxruntime`` are installed."""
    return _shipped(_SILERO_FILE, "onnxruntime")


def smart_turn_model() -> Path | None:
    """Smart Turn v3.2's ONNX model, when ``pipecat-ai``, ``onnxruntime`` and
    ``transformers`` (its feature extractor) are installed."""
    return _shipped(_SMART_TURN_FILE, "onnxruntime", "transformers")


@functools.cache
def _session(path: Path) -> Any:
    """One inference session per model and process: ``run`` is thread-safe and every
    stream's state goes in and out of it, so the sessions of all clients share one."""
    ort = importlib.import_module("onnxruntime")
    options = ort.SessionOptions()
    # One thread each: many sessions run at once, each a small model per frame.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


@functools.cache
def _features() -> Any:
    transformers = importlib.import_module("transformers")
    return transformers.WhisperFeatureExtractor(chunk_length=_TURN_SECONDS)


def _resample(audio: npt.NDArray[np.float64], size: int) -> npt.NDArray[np.float32]:
    """``audio`` stretched to ``size`` samples, by linear interpolation (speech above
    the target's Nyquist frequency is faint: little folds back)."""
    if audio.size == size:
        return audio.astype(np.float32)
    positions = (np.arange(size) + 0.5) * (audio.size / size) - 0.5
    stretched: npt.NDArray[np.float64] = np.interp(positions, np.arange(audio.size), audio)
    return stretched.astype(np.float32)


class SileroVoicing:
    """Silero VAD's speech probability per 32 ms frame, voiced from ``threshold`` on.

    Args:
        model: the ONNX file (:func:`silero_model`).
        sample_rate: the input's rate.
        threshold: the speech probability (0..1) a voiced frame reaches.
    """

    def __init__(self, model: Path, sample_rate: int, threshold: float) -> None:
        self._session = _session(model)
        self._rate = 8000 if sample_rate == 8000 else 16_000
        self._window = 256 if self._rate == 8000 else 512
        self.frame = round(self._window * sample_rate / self._rate)
        self.threshold = threshold
        # The model's recurrent state, and the last samples of the frame before (the
        # model sees each window with this much context in front).
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, 32 if self._rate == 8000 else 64), dtype=np.float32)
        self._sr = np.array(self._rate, dtype=np.int64)
        self.probabilities: list[float] = []
        """The probability of each frame of the last :meth:`voiced`."""

    def voiced(self, frames: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        """Run Silero over ``frames`` in order; which reach the threshold."""
        probabilities = np.empty(frames.shape[0], dtype=np.float64)
        for i, frame in enumerate(frames):
            window = _resample(frame, self._window)[None, :]
            audio = np.concatenate((self._context, window), axis=1)
            out, self._state = self._session.run(
                None, {"input": audio, "state": self._state, "sr": self._sr}
            )
            self._context = audio[:, -self._context.shape[1] :]
            probabilities[i] = float(out[0, 0])
        self.probabilities = probabilities.tolist()
        return probabilities >= self.threshold


class SmartTurn:
    """Smart Turn v3.2: whether the speech heard so far ends the user's turn.

    Args:
        model: the ONNX file (:func:`smart_turn_model`).
        sample_rate: the input's rate.
        threshold: the probability (0..1) of a finished turn that ends it.
    """

    def __init__(self, model: Path, sample_rate: int, threshold: float) -> None:
        self._session = _session(model)
        self._features = _features()
        self.rate = sample_rate
        self.threshold = threshold
        self._keep = _TURN_SECONDS * sample_rate  # the model sees the last 8 s
        self._audio = np.zeros(0, dtype=np.float64)
        self._start = 0  # the input's index of the first sample kept
        self.last_probability: float | None = None

    def heard(self, samples: npt.NDArray[np.float64]) -> None:
        """Keep the last 8 s of the input."""
        audio = np.concatenate((self._audio, samples))
        drop = max(0, audio.size - self._keep)
        self._audio = audio[drop:]
        self._start += drop

    def probability(self, start: int, end: int) -> float:
        """The probability that the speech from ``start`` to ``end`` (input samples; its
        last 8 s) ends a turn."""
        lo = max(0, start - self._start)
        hi = max(lo, min(end - self._start, self._audio.size))
        speech = self._audio[lo:hi]
        size = round(speech.size * _TURN_RATE / self.rate)
        audio = _resample(speech, size) if size else np.zeros(0, dtype=np.float32)
        padded = np.zeros(_TURN_RATE * _TURN_SECONDS, dtype=np.float32)
        if audio.size:
            padded[-min(audio.size, padded.size) :] = audio[-padded.size :]
        features = self._features(
            padded,
            sampling_rate=_TURN_RATE,
            padding="max_length",
            max_length=padded.size,
            truncation=True,
            do_normalize=True,
            return_tensors="np",
        ).input_features.astype(np.float32)
        (logits,) = self._session.run(None, {"input_features": features})
        self.last_probability = float(logits[0, 0])  # the model ends in a sigmoid
        return self.last_probability

    def complete(self, start: int, end: int) -> bool:
        """Whether the turn's probability of being finished reaches the threshold."""
        return self.probability(start, end) >= self.threshold
