"""Time to first audio against input length (``bench pipeline --preset tiny-omni``).

A voice agent hears the user in real time: audio reaches the pipeline in small frames
while the user speaks, and what the user waits for is the reply after they stop. If the
entry stage encodes audio as it arrives, that wait does not depend on how long they
spoke; if it buffers the audio and encodes it at the end of the input, the wait grows
with the input. This figure tells the two apart.

Each measured session is a fresh resumable session fed one deterministic clip in paced
20 ms frames (frame ``k`` leaves at ``start + k * 20 ms`` on the pipeline's clock, the
way a microphone delivers it), then ``end_segment()`` at ``start + length``, when the
clip has been fully spoken. TTFA and TTFT count from that call to the first
``AudioDelta`` / ``TextDelta`` the caller reads: the wait the user sees. Lengths are
interleaved within each repetition, so drifting load on a shared machine weighs on all
of them alike; the p50 over repetitions is reported, with the ratio of the longest
input's TTFA to the shortest's (the target: at most 1.2).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from omni_actors.bench.stats import percentile
from omni_actors.bench.steps import Steps
from omni_actors.clock import Clock
from omni_actors.errors import OmniError
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.protocols.events import TERMINAL, AudioDelta, ResponseDone, TextDelta

__all__ = [
    "DEFAULT_INPUT_AUDIO_S",
    "FRAME_S",
    "INPUT_SAMPLE_RATE",
    "TTFA_RATIO_LIMIT",
    "InputLengthError",
    "check_input_lengths",
    "input_length_table",
    "input_steps",
    "length_key",
    "measure_input_length",
    "send_paced",
    "synthetic_speech",
]

DEFAULT_INPUT_AUDIO_S = (5.0, 60.0)
FRAME_S = 0.02
"""One microphone frame: 20 ms, as realtime voice APIs send it."""
INPUT_SAMPLE_RATE = 16_000
"""What the tiny-omni thinker takes (mono float32)."""
_FRAME_SAMPLES = round(FRAME_S * INPUT_SAMPLE_RATE)
TTFA_RATIO_LIMIT = 1.2
"""The target: the longest input's TTFA p50 at most this times the shortest's."""
_WARMUP_S = 1.0  # one paced clip before measuring: first forwards, allocator, caches


class InputLengthError(OmniError, ValueError):
    """An input length the figure cannot be measured at (not a whole number of frames)."""


def input_steps(lengths_s: Sequence[float], repeats: int) -> int:
    """The steps :func:`measure_input_length` takes: a warm-up, then each session."""
    return 1 + len(lengths_s) * repeats if lengths_s else 0


def check_input_lengths(lengths_s: Sequence[float]) -> tuple[float, ...]:
    """``lengths_s`` if every one is a positive whole number of 20 ms frames, distinct.

    Raises:
        InputLengthError: naming the offending value and what would do instead.
    """
    if not lengths_s:
        raise InputLengthError("give at least one input length in seconds (e.g. 5 60)")
    for seconds in lengths_s:
        frames = seconds / FRAME_S
        if not math.isfinite(seconds) or seconds < FRAME_S or abs(frames - round(frames)) > 1e-6:
            raise InputLengthError(
                f"input length {seconds:g}s is not a positive whole number of "
                f"{FRAME_S * 1e3:g} ms frames; use e.g. 0.2, 5 or 60"
            )
    keys = [length_key(s) for s in lengths_s]
    if len(set(keys)) != len(keys):
        raise InputLengthError(f"input lengths must be distinct, got {', '.join(keys)} s")
    return tuple(lengths_s)


def length_key(seconds: float) -> str:
    """The JSON key of a length: ``"5"``, ``"60"``, ``"0.2"``."""
    return f"{seconds:g}"


def synthetic_speech(
    seconds: float, seed: int = 0, sample_rate: int = INPUT_SAMPLE_RATE
) -> torch.Tensor:
    """``seconds`` of deterministic speech-like audio, mono float32 (16 kHz by default).

    Syllable-rate (4 Hz) bursts of a few harmonics over a 140 Hz pitch, plus seeded
    noise: not speech, but it has speech's level and its energy in the band an audio
    encoder listens to, and the same ``seed`` always gives the same samples.
    """
    n = round(seconds * sample_rate)
    t = torch.arange(n, dtype=torch.float64) / sample_rate
    voiced = sum(torch.sin(2 * math.pi * 140 * h * t) / h for h in (1, 2, 3, 5))
    envelope = 0.5 * (1 - torch.cos(2 * math.pi * 4 * t))
    noise = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (0.15 * envelope * voiced + 0.01 * noise).to(torch.float32)


@dataclass(frozen=True, slots=True)
class _Sample:
    """One session's waits after the end of its input, and how late its frames left."""

    ttfa_ms: float
    ttft_ms: float | None
    e2e_ms: float
    max_send_lag_ms: float
    first_output_ms: dict[str, float]
    """Per stage, its first output of the reply's segment after the end of input
    (negative: before it, as a thinker that sends a turn's rows while it is spoken)."""


class _AudioInput(Protocol):
    """Where paced frames go: a :class:`Session`, or a test's recorder."""

    async def send(self, *, audio: torch.Tensor, sample_rate: int) -> None: ...


async def _until(clock: Clock, when: float) -> None:
    """Sleep until ``clock`` reads ``when`` (virtual time under a test kit)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    timer = clock.call_at(when, wake)
    try:
        await done
    finally:
        timer.cancel()


async def send_paced(session: _AudioInput, clip: torch.Tensor, clock: Clock) -> float:
    """Send ``clip`` in 20 ms frames at real-time pace; return once it has played.

    Frame ``k`` leaves at ``start + k * 20 ms`` on ``clock`` (the pipeline's, so a
    virtual clock paces it in tests), and the call returns at ``start + n * 20 ms``, the
    moment a speaker of the clip would stop. A ``send`` that waits for room
    (backpressure) makes later frames late; they then leave at once, as a microphone's
    buffered frames would, and the pace resumes on the original schedule.

    Returns:
        The worst lateness of a frame, in seconds (0 when every frame left on time).
    """
    start = clock.now()
    lag = 0.0
    frames = [clip[i : i + _FRAME_SAMPLES] for i in range(0, clip.numel(), _FRAME_SAMPLES)]
    for k, frame in enumerate(frames):
        due = start + k * FRAME_S
        await _until(clock, due)
        lag = max(lag, clock.now() - due)
        await session.send(audio=frame, sample_rate=INPUT_SAMPLE_RATE)
    await _until(clock, start + len(frames) * FRAME_S)
    return lag


async def _session(omni: OmniPipeline, clip: torch.Tensor) -> _Sample | str:
    """One fresh session: the clip in paced frames, then its reply read to the end."""
    try:
        async with omni.session() as session:
            lag = await send_paced(session, clip, omni.clock)
            ended, ended_wall = time.perf_counter(), time.time()
            response = await session.end_segment()
            ttfa: float | None = None
            ttft: float | None = None
            async for event in response.events():
                now = (time.perf_counter() - ended) * 1e3
                if isinstance(event, AudioDelta) and ttfa is None:
                    ttfa = now
                elif isinstance(event, TextDelta) and ttft is None:
                    ttft = now
                elif isinstance(event, ResponseDone):
                    if event.status != "completed":
                        return f"the reply ended {event.status}: {event.code} {event.message}"
                    if ttfa is None:
                        return "the reply finished without audio"
                    first = {
                        stage: (metrics.first_output_at - ended_wall) * 1e3
                        for stage, metrics in event.metrics.stages.items()
                        if metrics.first_output_at is not None
                    }
                    return _Sample(ttfa, ttft, now, lag * 1e3, first)
                elif isinstance(event, TERMINAL):
                    return f"the session ended before its reply finished: {event!r}"
            return "the reply's events ended without ResponseDone"
    except OmniError as exc:
        return f"{type(exc).__name__}: {exc}"


def _p50(values: list[float]) -> float:
    return round(percentile(values, 50), 1)


def _length(results: list[_Sample | str]) -> dict[str, Any]:
    samples = [r for r in results if isinstance(r, _Sample)]
    errors = [r for r in results if isinstance(r, str)]
    entry: dict[str, Any] = {"sessions": len(results), "errors": len(errors)}
    if samples:
        ttft = [s.ttft_ms for s in samples if s.ttft_ms is not None]
        entry |= {
            "ttfa_after_input_ms_p50": _p50([s.ttfa_ms for s in samples]),
            "ttfa_after_input_ms": [round(s.ttfa_ms, 1) for s in samples],
            "ttft_after_input_ms_p50": _p50(ttft) if ttft else None,
            "e2e_after_input_ms_p50": _p50([s.e2e_ms for s in samples]),
            "max_send_lag_ms": round(max(s.max_send_lag_ms for s in samples), 1),
            # Where the wait after the input goes: each stage's first output, so a TTFA
            # that grows with the input shows which stage it grows in.
            "first_output_after_input_ms_p50": {
                stage: _p50(
                    [s.first_output_ms[stage] for s in samples if stage in s.first_output_ms]
                )
                for stage in sorted({stage for s in samples for stage in s.first_output_ms})
            },
        }
    if errors:
        entry["first_error"] = errors[0]
    return entry


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not every platform has a load average
        return None


async def measure_input_length(
    omni: OmniPipeline,
    lengths_s: Sequence[float],
    repeats: int,
    *,
    seed: int = 0,
    steps: Steps | None = None,
) -> dict[str, Any]:
    """TTFA and TTFT after the end of paced audio input, per input length.

    Args:
        omni: a started pipeline whose entry stage takes 16 kHz ``audio``, with room
            for one session.
        lengths_s: seconds of input audio, each a whole number of 20 ms frames.
        repeats: sessions per length (fresh ones; the p50 is reported).
        seed: the synthetic audio's seed (every session of a length hears the same clip).
        steps: the run's steps, this taking ``input_steps(lengths_s, repeats)`` of them
            (the warm-up session, then each session).

    Returns:
        ``lengths`` (per length key, shortest first: TTFA/TTFT/E2E p50 after the end
        of input, the TTFA of each session, the worst frame lateness, errors),
        ``ttfa_ratio`` (the longest length's TTFA p50 over the shortest's, the target
        being :data:`TTFA_RATIO_LIMIT`; None with one length or a failed length), and
        the machine's 1-minute load average at start and end.

    Raises:
        InputLengthError: a length is not a positive whole number of frames.
        ValueError: ``repeats`` below 1.
    """
    lengths = tuple(sorted(check_input_lengths(lengths_s)))
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    steps = steps or Steps(None, 0)
    load_start = _load()
    steps.start("input length: warm-up session")
    await _session(omni, synthetic_speech(_WARMUP_S, seed + 1))
    clips = {length_key(s): synthetic_speech(s, seed) for s in lengths}
    results: dict[str, list[_Sample | str]] = {key: [] for key in clips}
    for repeat in range(1, repeats + 1):
        for key, clip in clips.items():
            steps.start(f"input length {key}, session {repeat}/{repeats}")
            results[key].append(await _session(omni, clip))
    per_length = {key: _length(found) for key, found in results.items()}
    shortest, longest = length_key(min(lengths)), length_key(max(lengths))
    low = per_length[shortest].get("ttfa_after_input_ms_p50")
    high = per_length[longest].get("ttfa_after_input_ms_p50")
    ratio = round(high / low, 3) if len(lengths) > 1 and low and high is not None else None
    return {
        "lengths": per_length,
        "ttfa_ratio": ratio,
        "load_1m": {"start": load_start, "end": _load()},
        "parameters": {
            "input_audio_s": list(lengths),
            "repeats": repeats,
            "frame_ms": FRAME_S * 1e3,
            "sample_rate": INPUT_SAMPLE_RATE,
            "warmup_s": _WARMUP_S,
            "seed": seed,
        },
    }


def input_length_table(section: dict[str, Any]) -> list[str]:
    """The figure as a few lines of text: one row per input length, then the ratio."""
    parameters = section["parameters"]
    rows = [
        f"TTFA after the end of input (paced {parameters['frame_ms']:g} ms frames, "
        f"p50 of {parameters['repeats']} sessions per length)",
        f"{'input_s':>8} {'ttfa_ms':>9} {'ttft_ms':>9} {'e2e_ms':>9} {'errors':>7}",
    ]
    for key, entry in section["lengths"].items():
        cells = [
            entry.get(name)
            for name in (
                "ttfa_after_input_ms_p50",
                "ttft_after_input_ms_p50",
                "e2e_after_input_ms_p50",
            )
        ]
        shown = " ".join(f"{'-' if c is None else f'{c:.1f}':>9}" for c in cells)
        rows.append(f"{key:>8} {shown} {entry['errors']:>7}")
    keys = list(section["lengths"])
    ratio = section["ttfa_ratio"]
    if ratio is not None:
        rows.append(
            f"TTFA {keys[-1]} s / {keys[0]} s: {ratio:.2f} (target <= {TTFA_RATIO_LIMIT:g}); "
            f"load average {section['load_1m']['start']} -> {section['load_1m']['end']}"
        )
    return rows
