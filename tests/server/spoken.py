"""Speech for the turn-detection tests, synthesized by espeak-ng (``make speech``)."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np
import pytest
import torch

from omni_actors.audio.wav import resample

ESPEAK = shutil.which("espeak-ng")


def need_espeak() -> None:
    """Skip the test without espeak-ng (``make speech`` installs it)."""
    if ESPEAK is None:
        pytest.skip("espeak-ng is not installed (make speech, or apt-get install espeak-ng)")


def say(text: str, rate: int) -> torch.Tensor:
    """``text`` spoken by espeak-ng (its default English voice, 160 words a minute), as
    float samples at ``rate``, with the synthesizer's own leading and trailing silence
    cut off: sample 0 is the onset and the last sample the end of the speech."""
    need_espeak()
    assert ESPEAK is not None
    wav = subprocess.run(
        [ESPEAK, "--stdout", "-v", "en", "-s", "160", text], capture_output=True, check=True
    ).stdout
    with wave.open(io.BytesIO(wav)) as reader:
        source_rate = reader.getframerate()
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
    audio = torch.from_numpy(pcm.astype(np.float32) / 32768.0)
    audio = resample(audio, source_rate, rate)
    loud = torch.nonzero(audio.abs() > 0.01).flatten()
    return audio[int(loud[0]) : int(loud[-1]) + 1].contiguous()


def silence(ms: float, rate: int) -> torch.Tensor:
    return torch.zeros(round(rate * ms / 1000))
