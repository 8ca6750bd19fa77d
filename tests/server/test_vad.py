"""ServerVad: one start/stop pair per utterance, at OpenAI's times, whatever the chunking."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_actors.server.vad import (
    ServerVad,
    SpeechStarted,
    SpeechStopped,
    VadEvent,
    threshold_dbfs,
)

RATE = 24000
FRAME_MS = 10


def silence(ms: float) -> torch.Tensor:
    return torch.zeros(round(RATE * ms / 1000))


def tone(ms: float, dbfs: float = -20.0, hz: float = 220.0) -> torch.Tensor:
    amplitude = math.sqrt(2) * 10 ** (dbfs / 20)  # a sine's RMS is amplitude / sqrt(2)
    t = torch.arange(round(RATE * ms / 1000), dtype=torch.float64) / RATE
    return (amplitude * torch.sin(2 * math.pi * hz * t)).to(torch.float32)


def noise(ms: float, dbfs: float = -20.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(round(RATE * ms / 1000), generator=g) * 10 ** (dbfs / 20)


def run(audio: torch.Tensor, vad: ServerVad | None = None, piece: int = 480) -> list[VadEvent]:
    """Feeds ``audio`` in 20 ms pieces, as a realtime client sends it."""
    vad = vad or ServerVad(sample_rate=RATE)
    events: list[VadEvent] = []
    for start in range(0, audio.numel(), piece):
        events += vad.feed(audio[start : start + piece])
    return events


def pair(events: list[VadEvent]) -> tuple[int, int]:
    assert len(events) == 2, events
    started, stopped = events
    assert isinstance(started, SpeechStarted)
    assert isinstance(stopped, SpeechStopped)
    return started.audio_start_ms, stopped.audio_end_ms


@pytest.mark.parametrize("burst", [tone, noise])
@pytest.mark.parametrize("onset_ms", [1000, 1003, 1337])
def test_a_burst_in_silence_is_one_start_and_stop_at_openais_times(
    burst: object, onset_ms: int
) -> None:
    audio = torch.cat((silence(onset_ms), burst(1200), silence(1500)))  # type: ignore[operator]
    start, end = pair(run(audio))
    # Start: the speech's onset minus the 300 ms prefix padding.
    assert abs(start - (onset_ms - 300)) <= FRAME_MS
    # End: where the silence began plus the 500 ms silence duration.
    assert abs(end - (onset_ms + 1200 + 500)) <= FRAME_MS


def test_settings_move_the_times() -> None:
    vad = ServerVad(sample_rate=16000, prefix_padding_ms=100, silence_duration_ms=800)
    audio = torch.cat((silence(500), tone(600), silence(1000)))
    audio16 = torch.nn.functional.interpolate(audio[None, None], scale_factor=2 / 3)[0, 0]
    start, end = pair(run(audio16, vad, piece=320))
    assert abs(start - 400) <= FRAME_MS
    assert abs(end - 1900) <= FRAME_MS


def test_the_start_is_floored_at_zero() -> None:
    assert pair(run(torch.cat((silence(100), tone(500), silence(800)))))[0] == 0


def test_events_come_when_they_are_detected() -> None:
    vad = ServerVad(sample_rate=RATE, min_speech_ms=100, silence_duration_ms=500)
    assert vad.feed(silence(1000)) == []
    assert vad.feed(tone(90)) == []  # not yet 100 ms of speech
    assert not vad.speaking
    assert vad.feed(tone(10)) == [SpeechStarted(audio_start_ms=700)]
    assert vad.speaking
    assert vad.feed(tone(400)) == []
    assert vad.feed(silence(490)) == []  # a pause, not yet the end
    assert vad.feed(silence(10)) == [SpeechStopped(audio_end_ms=2000)]
    assert not vad.speaking
    assert vad.audio_ms == 2000


@pytest.mark.parametrize("click_ms", [5, 30, 90])
def test_clicks_and_short_bursts_do_not_start_speech(click_ms: int) -> None:
    pieces = []
    for i in range(10):
        pieces += [silence(400), noise(click_ms, dbfs=-3.0, seed=i)]
    assert run(torch.cat(pieces)) == []


def test_a_burst_just_over_the_minimum_starts_speech() -> None:
    events = run(torch.cat((silence(400), noise(120, dbfs=-10.0), silence(1000))))
    assert pair(events) == (100, 1020)


def test_silence_and_room_noise_never_trigger() -> None:
    assert run(silence(5000)) == []
    assert run(noise(10_000, dbfs=-55.0)) == []


def test_loud_continuous_audio_starts_once_and_never_stops() -> None:
    vad = ServerVad(sample_rate=RATE)
    events = run(noise(20_000, dbfs=-20.0), vad)
    assert events == [SpeechStarted(audio_start_ms=0)]
    assert vad.speaking


def test_a_pause_shorter_than_the_silence_duration_keeps_the_turn() -> None:
    audio = torch.cat((silence(1000), tone(800), silence(400), tone(800), silence(1000)))
    assert pair(run(audio)) == (700, 3500)


def test_threshold_maps_to_a_frame_level() -> None:
    assert threshold_dbfs(0.5) == -40.0
    assert threshold_dbfs(0.0) == -70.0
    assert threshold_dbfs(1.0) == -10.0
    quiet = torch.cat((silence(500), tone(1000, dbfs=-45.0), silence(1000)))
    assert run(quiet, ServerVad(sample_rate=RATE, threshold=0.5)) == []
    assert len(run(quiet, ServerVad(sample_rate=RATE, threshold=0.3))) == 2
    loud = torch.cat((silence(500), tone(1000, dbfs=-35.0), silence(1000)))
    assert len(run(loud, ServerVad(sample_rate=RATE, threshold=0.5))) == 2
    assert run(loud, ServerVad(sample_rate=RATE, threshold=0.9)) == []


def test_int16_input_gives_the_same_events_as_float() -> None:
    audio = torch.cat((silence(700), noise(900, dbfs=-25.0), silence(900), tone(300)))
    as_int16 = (audio * 32768).round().clamp(-32768, 32767).to(torch.int16)
    assert run(as_int16) == run(audio)
    assert len(run(audio)) == 3


def test_reset_forgets_speech_but_keeps_time() -> None:
    vad = ServerVad(sample_rate=RATE, prefix_padding_ms=0)
    assert run(torch.cat((silence(1000), tone(500))), vad) == [SpeechStarted(audio_start_ms=1000)]
    vad.reset()  # the client committed mid-speech
    assert not vad.speaking
    assert vad.audio_ms == 1500
    assert run(tone(500), vad) == [SpeechStarted(audio_start_ms=1500)]
    assert run(silence(600), vad) == [SpeechStopped(audio_end_ms=2500)]


_SCENE = torch.cat(
    (
        silence(330),
        noise(25, dbfs=-6.0),  # a click
        silence(700),
        tone(900, dbfs=-25.0),
        silence(300),  # a pause inside the turn
        noise(600, dbfs=-30.0, seed=1),
        silence(700),
        tone(2000, dbfs=-15.0),
    )
)
_SCENE_EVENTS = run(_SCENE, piece=_SCENE.numel())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=40))
def test_events_do_not_depend_on_chunking(sizes: list[int]) -> None:
    vad = ServerVad(sample_rate=RATE)
    events: list[VadEvent] = []
    start = 0
    for size in sizes:
        events += vad.feed(_SCENE[start : start + size])
        start += size
    events += vad.feed(_SCENE[start:])
    assert events == _SCENE_EVENTS


def test_the_chunking_scene_has_two_turns() -> None:
    assert [type(e) for e in _SCENE_EVENTS] == [SpeechStarted, SpeechStopped, SpeechStarted]
    assert run(_SCENE, piece=37) == _SCENE_EVENTS  # pieces of no whole frame


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sample_rate": 0}, "sample_rate must be an int >= 100"),
        ({"sample_rate": 24000.0}, "sample_rate must be an int"),
        ({"threshold": 1.5}, r"threshold must be in 0.0..1.0"),
        ({"threshold": -0.1}, r"threshold must be in 0.0..1.0"),
        ({"threshold": float("nan")}, r"threshold must be in 0.0..1.0"),
        ({"threshold": "0.5"}, r"threshold must be a number"),
        ({"prefix_padding_ms": -1}, "prefix_padding_ms must be an int >= 0"),
        ({"silence_duration_ms": 0}, "silence_duration_ms must be an int >= 1"),
        ({"min_speech_ms": -5}, "min_speech_ms must be an int >= 0"),
    ],
)
def test_bad_settings_name_the_allowed_range(kwargs: dict[str, object], match: str) -> None:
    settings_ = {"sample_rate": RATE, **kwargs}
    with pytest.raises(ValueError, match=match):
        ServerVad(**settings_)  # type: ignore[arg-type]


def test_integer_audio_other_than_int16_is_refused() -> None:
    with pytest.raises(ValueError, match="int16 or float"):
        ServerVad(sample_rate=RATE).feed(torch.zeros(10, dtype=torch.int32))
