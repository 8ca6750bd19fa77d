"""The TTFA-vs-input-length figure of ``bench pipeline --preset tiny-omni``.

The pacing is checked on a virtual clock (the schedule exactly, with no sleeps); the
option values without running anything; the figure itself on the tiny-omni weights
(integration), for its shape and that its numbers were measured. Benchmarks are never
timed assertions: nothing here bounds a latency.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from omni_actors.bench.input_length import (
    INPUT_SAMPLE_RATE,
    InputLengthError,
    check_input_lengths,
    input_length_table,
    send_paced,
    synthetic_speech,
)
from omni_actors.cli import main
from omni_actors.testing import VirtualClock, eventually

FRAME = 320  # 20 ms at 16 kHz


class Recorder:
    """A session stand-in: the virtual time and size of every frame sent."""

    def __init__(self, clock: VirtualClock, stall: dict[int, float] | None = None) -> None:
        self.clock = clock
        self.stall = stall or {}  # frame index -> virtual seconds its send waits
        self.sent: list[tuple[float, int]] = []

    async def send(self, *, audio: torch.Tensor, sample_rate: int) -> None:
        assert sample_rate == INPUT_SAMPLE_RATE
        self.sent.append((round(self.clock.now(), 6), audio.numel()))
        self.clock.advance(self.stall.get(len(self.sent) - 1, 0.0))


async def drive(clock: VirtualClock, recorder: Recorder, clip: torch.Tensor) -> float:
    """Run ``send_paced`` to its end, moving virtual time to each timer it sets."""
    task = asyncio.create_task(send_paced(recorder, clip, clock))
    try:
        while True:
            await eventually(lambda: task.done() or clock.pending(), what="a timer or the end")
            if task.done():
                return task.result()
            clock.advance(clock.pending()[0])
    finally:
        task.cancel()


async def test_frame_k_leaves_at_k_times_20_ms_and_the_input_ends_when_the_clip_has_played() -> (
    None
):
    clock = VirtualClock(start=100.0)
    recorder = Recorder(clock)

    lag = await drive(clock, recorder, torch.zeros(5 * FRAME))

    assert recorder.sent == [(round(100.0 + 0.02 * k, 6), FRAME) for k in range(5)]
    assert clock.now() == pytest.approx(100.1)  # returns once 5 x 20 ms have played
    assert lag == 0.0


async def test_a_frame_held_up_by_backpressure_delays_the_next_ones_not_the_schedule() -> None:
    # Frame 1's send waits 50 ms: frame 2 (due at 40) leaves at once, 30 ms late; frame
    # 3 (due at 60) too, 10 ms late; frame 4 is back on the original schedule.
    clock = VirtualClock()
    recorder = Recorder(clock, stall={1: 0.05})

    lag = await drive(clock, recorder, torch.zeros(5 * FRAME))

    assert [t for t, _ in recorder.sent] == pytest.approx([0.0, 0.02, 0.07, 0.07, 0.08])
    assert lag == pytest.approx(0.03)
    assert clock.now() == pytest.approx(0.1)


def test_synthetic_speech_is_deterministic_16k_float32() -> None:
    clip = synthetic_speech(0.5, seed=3)

    assert clip.dtype == torch.float32
    assert clip.shape == (INPUT_SAMPLE_RATE // 2,)
    assert torch.equal(clip, synthetic_speech(0.5, seed=3))
    assert not torch.equal(clip, synthetic_speech(0.5, seed=4))
    assert bool(torch.isfinite(clip).all())
    assert 0.05 < float(clip.abs().max()) < 1.0  # audible, never clipping


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([], "at least one input length"),
        ([0.0], "0s is not a positive whole number of 20 ms frames"),
        ([-5.0], "-5s is not a positive"),
        ([0.03], "0.03s is not a positive whole number"),
        ([math.nan], "nans is not"),
        ([5.0, 5.0], "must be distinct, got 5, 5 s"),
    ],
)
def test_lengths_that_are_not_whole_frames_are_refused(lengths: list[float], message: str) -> None:
    with pytest.raises(InputLengthError, match=message):
        check_input_lengths(lengths)


def test_whole_frame_lengths_are_accepted() -> None:
    assert check_input_lengths([0.02, 0.2, 5, 60]) == (0.02, 0.2, 5, 60)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (["--input-audio-s", "0"], "0s is not a positive whole number of 20 ms frames"),
        (["--input-audio-s", "5", "0.03"], "0.03s is not a positive whole number"),
        (["--input-audio-s", "five"], "not a number: 'five'"),
        (["--input-audio-s"], "expected at least one argument"),
        (["--input-repeats", "0"], "must be >= 1"),
        (["--input-audio-s", "5", "--no-input-length"], "not allowed with argument"),
    ],
)
def test_bad_option_values_are_usage_errors_that_say_why(
    options: list[str], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "pipeline", "--preset", "tiny-omni", "--cache-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        main([*argv, *options])

    assert info.value.code == 2
    assert reason in capsys.readouterr().err


def test_repeated_lengths_are_refused_before_anything_runs(tmp_path: Path) -> None:
    argv = ["bench", "pipeline", "--preset", "tiny-omni", "--cache-dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="input lengths must be distinct, got 5, 5 s"):
        main([*argv, "--input-audio-s", "5", "5"])
    assert not any(tmp_path.iterdir())  # no weights were prepared


@pytest.mark.parametrize("preset", [[], ["--preset", "scripted-omni"]])
def test_input_lengths_for_a_pipeline_without_audio_input_name_the_fix(preset: list[str]) -> None:
    with pytest.raises(SystemExit, match="add --preset tiny-omni"):
        main(["bench", "pipeline", *preset, "--input-audio-s", "5"])


def test_the_text_table_has_a_row_per_length_and_the_ratio() -> None:
    section: dict[str, Any] = {
        "lengths": {
            "5": {
                "errors": 0,
                "ttfa_after_input_ms_p50": 56.04,
                "ttft_after_input_ms_p50": 20.0,
                "e2e_after_input_ms_p50": 900.0,
            },
            "60": {"errors": 3},  # every session failed: no numbers
        },
        "ttfa_ratio": 3.16,
        "load_1m": {"start": 1.5, "end": 2.0},
        "parameters": {"frame_ms": 20.0, "repeats": 3},
    }

    lines = input_length_table(section)

    assert "paced 20 ms frames, p50 of 3 sessions" in lines[0]
    assert lines[2].split() == ["5", "56.0", "20.0", "900.0", "0"]
    assert lines[3].split() == ["60", "-", "-", "-", "3"]
    assert lines[4].startswith("TTFA 60 s / 5 s: 3.16 (target <= 1.2)")
    assert "load average 1.5 -> 2.0" in lines[4]


# -- on the tiny-omni weights ------------------------------------------------------------


@pytest.mark.integration
def test_the_figure_is_measured_per_length_shortest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "pipeline", "--preset", "tiny-omni", "--json", "--cache-dir", str(tmp_path)]
    quick = ["--concurrency", "1", "--requests", "1", "--reply-tokens", "8"]
    lengths = ["--input-audio-s", "0.4", "0.2", "--input-repeats", "2"]

    assert main([*argv, *quick, *lengths]) == 0

    report = json.loads(capsys.readouterr().out)
    section = report["input_length"]
    assert list(section["lengths"]) == ["0.2", "0.4"]  # ordered by length, as given or not
    for key, entry in section["lengths"].items():
        assert entry["errors"] == 0, entry.get("first_error")
        assert entry["sessions"] == 2
        ttfa = entry["ttfa_after_input_ms"]
        assert len(ttfa) == 2, key
        assert all(math.isfinite(t) and t > 0 for t in ttfa), key
        # The p50 of two is their mean (``bench.stats.percentile``), within rounding.
        assert entry["ttfa_after_input_ms_p50"] == pytest.approx(sum(ttfa) / 2, abs=0.1)
        assert entry["ttft_after_input_ms_p50"] > 0
        assert entry["e2e_after_input_ms_p50"] >= entry["ttfa_after_input_ms_p50"]
        assert entry["max_send_lag_ms"] >= 0
        # Each stage's first output after the input ended: the audio's last stage's is
        # about when the first audio delta left (the client's TTFA, read later).
        first = entry["first_output_after_input_ms_p50"]
        assert set(first) == {"thinker", "talker", "code2wav"}, key
        assert first["thinker"] <= first["talker"] <= first["code2wav"], first
        assert first["code2wav"] <= entry["ttfa_after_input_ms_p50"] + 1.0, first
    p50 = {k: e["ttfa_after_input_ms_p50"] for k, e in section["lengths"].items()}
    assert section["ttfa_ratio"] == pytest.approx(p50["0.4"] / p50["0.2"], abs=1e-3)
    target = report["targets"]["input_length_ttfa_ratio"]
    assert target["limit"] == 1.2
    assert target["measured"] == section["ttfa_ratio"]
    assert target["met"] is (section["ttfa_ratio"] <= 1.2)
    assert section["parameters"]["input_audio_s"] == [0.2, 0.4]
    assert report["parameters"]["input_repeats"] == 2
    rows = input_length_table(section)
    assert [row.split()[0] for row in rows[2:4]] == ["0.2", "0.4"]
