"""What the realtime examples share: the caller's side of a call.

A caller needs the server (its realtime URL, its key, the model it serves), something to
say (a WAV file, or a synthesized utterance when there is no microphone), and somewhere
to put the reply (a WAV file). Audio is PCM16 mono at 24 kHz, the Realtime API's format.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import urllib.request
import wave
from pathlib import Path

import numpy as np

RATE = 24_000  # PCM16 mono at 24 kHz: the Realtime API's default audio format
DEFAULT_URL = "ws://127.0.0.1:8000/v1/realtime"


def arguments(description: str) -> argparse.Namespace:
    """The command line every example takes: the server's URL, its key, what to say,
    where to write the reply."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("url", nargs="?", default=DEFAULT_URL, help=f"default {DEFAULT_URL}")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OMNI_ACTORS_API_KEY", "none"),
        help="the server's key (omni-actors serve --api-key); default $OMNI_ACTORS_API_KEY",
    )
    parser.add_argument(
        "--wav",
        type=Path,
        help="what the caller says, a WAV of speech (default: 0.6 s of a tone, which only a "
        "server without Silero VAD, the turns extra, takes for speech)",
    )
    parser.add_argument("--out", type=Path, default=Path("reply.wav"), help="the reply's audio")
    return parser.parse_args()


def served_model(url: str, api_key: str) -> str:
    """The model the server at ``url`` serves (``GET /v1/models``): a client that names
    another one is refused, and each client here names one."""
    http = url.replace("ws", "http", 1).split("/v1/", 1)[0]
    request = urllib.request.Request(
        f"{http}/v1/models", headers={"Authorization": f"Bearer {api_key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        model: str = json.load(response)["data"][0]["id"]
    return model


def utterance(wav: Path | None) -> bytes:
    """What the caller says, as PCM16 at 24 kHz: ``wav`` (any rate, mono or stereo,
    16-bit), or 0.6 s of a 220 Hz tone under noise, loud enough for a frame-energy voice
    activity detection to take it for speech (Silero VAD, which a server with the
    ``turns`` extra runs, rightly hears none in it: give that one a recording)."""
    if wav is None:
        t = np.arange(int(0.6 * RATE)) / RATE
        noise = np.random.default_rng(0).standard_normal(t.size)
        samples = 0.3 * (0.6 * np.sin(2 * math.pi * 220 * t) + 0.4 * noise)
    else:
        with wave.open(str(wav), "rb") as f:
            if f.getsampwidth() != 2:
                raise SystemExit(f"{wav}: 16-bit PCM WAV expected")
            pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
            rate, channels = f.getframerate(), f.getnchannels()
        mono = pcm.reshape(-1, channels).mean(axis=1) / 32768.0
        at = np.arange(int(mono.size * RATE / rate)) * rate / RATE  # linear resampling
        samples = np.interp(at, np.arange(mono.size), mono)
    return bytes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def silence(seconds: float) -> bytes:
    """``seconds`` of silence: what ends a turn for the server's voice activity detection."""
    return bytes(2 * int(seconds * RATE))


def write_wav(path: Path, pcm16: bytes, rate: int = RATE) -> None:
    """Write mono PCM16 ``pcm16`` to ``path``."""
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm16)
