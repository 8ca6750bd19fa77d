"""Turn detection on speech: Silero VAD (``server_vad``) and Smart Turn (``semantic_vad``).

Sentences are spoken by espeak-ng and fed in 20 ms pieces, as a client streams its
microphone; every time is in audio, not on the clock. Silence is digital zeros.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from spoken import need_espeak, say, silence

from omni_actors.server import turn_models
from omni_actors.server.session_config import VadSettings
from omni_actors.server.turns import EAGERNESS, server_vad
from omni_actors.server.vad import EnergyVoicing, ServerVad, SpeechStarted, SpeechStopped

pytestmark = pytest.mark.real_speech

SENTENCE = "The weather today is sunny and warm, so let us go for a walk in the park."
ONSET_MS = 1000  # silence before the sentence


@pytest.fixture(autouse=True)
def _models() -> None:
    if turn_models.silero_model() is None or turn_models.smart_turn_model() is None:
        pytest.skip("Silero VAD and Smart Turn are not installed (extra semantic-vad)")
    need_espeak()


def spoken(rate: int, cut: float = 1.0, after_ms: int = 3000) -> tuple[torch.Tensor, int]:
    """Silence, the sentence (its first ``cut`` of it), silence; and where it ends (ms)."""
    speech = say(SENTENCE, rate)
    speech = speech[: round(speech.numel() * cut)]
    audio = torch.cat([silence(ONSET_MS, rate), speech, silence(after_ms, rate)])
    return audio, ONSET_MS + speech.numel() * 1000 // rate


def events(vad: ServerVad, audio: torch.Tensor, rate: int) -> list[tuple[object, int]]:
    """Each event, with where in the audio it came (the end of the piece it came with)."""
    piece = rate // 50
    out: list[tuple[object, int]] = []
    for start in range(0, audio.numel(), piece):
        at = min(start + piece, audio.numel()) * 1000 // rate
        out += [(event, at) for event in vad.feed(audio[start : start + piece])]
    return out


def one_turn(found: list[tuple[object, int]]) -> tuple[SpeechStarted, int, SpeechStopped, int]:
    assert [type(e) for e, _ in found] == [SpeechStarted, SpeechStopped], found
    (started, started_at), (stopped, stopped_at) = found
    assert isinstance(started, SpeechStarted)
    assert isinstance(stopped, SpeechStopped)
    return started, started_at, stopped, stopped_at


@pytest.mark.parametrize("rate", [24_000, 16_000, 8_000])
def test_server_vad_hears_a_spoken_sentence_start_and_stop(rate: int) -> None:
    vad = server_vad(VadSettings(), rate)
    assert isinstance(vad.voicing, turn_models.SileroVoicing)
    audio, end_ms = spoken(rate)
    started, started_at, stopped, stopped_at = one_turn(events(vad, audio, rate))
    # OpenAI's times: the start less prefix_padding_ms (300), the end plus
    # silence_duration_ms (500); Silero's 32 ms frames and its 100 ms minimum put the
    # start up to ~150 ms late and the end a frame or two after the last sound.
    assert ONSET_MS - 300 <= started.audio_start_ms <= ONSET_MS - 300 + 150
    assert started_at <= ONSET_MS + 250
    assert end_ms + 500 - 50 <= stopped.audio_end_ms <= end_ms + 500 + 200
    assert stopped_at - stopped.audio_end_ms <= 40  # told as soon as it is known


def test_server_vad_settings_keep_their_meaning_on_silero() -> None:
    rate = 16_000
    audio, end_ms = spoken(rate)
    vad = server_vad(VadSettings(prefix_padding_ms=0, silence_duration_ms=1200), rate)
    started, _, stopped, _ = one_turn(events(vad, audio, rate))
    assert ONSET_MS <= started.audio_start_ms <= ONSET_MS + 150
    assert end_ms + 1200 - 50 <= stopped.audio_end_ms <= end_ms + 1200 + 200
    # A threshold no frame's speech probability reaches hears nothing.
    deaf = server_vad(VadSettings(threshold=1.0), rate)
    assert events(deaf, audio, rate) == []


def test_silero_hears_no_speech_in_a_loud_tone_the_energy_vad_takes_for_speech() -> None:
    rate = 16_000
    t = torch.arange(2 * rate) / rate
    tone = 0.3 * torch.sin(2 * torch.pi * 220 * t)
    audio = torch.cat([silence(500, rate), tone, silence(1000, rate)])
    assert events(server_vad(VadSettings(), rate), audio, rate) == []
    energy = ServerVad(sample_rate=rate, voicing=EnergyVoicing(rate, 0.5))
    assert len(events(energy, audio, rate)) == 2


@pytest.mark.parametrize("absent", ["silero_vad", "onnxruntime"])
def test_without_silero_vad_server_vad_runs_the_energy_vad(
    absent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, absent, None)  # as if not installed
    assert turn_models.silero_model() is None
    assert turn_models.smart_turn_model() is None or absent == "silero_vad"
    vad = server_vad(VadSettings(), 16_000)
    assert isinstance(vad.voicing, EnergyVoicing)
    audio, _ = spoken(16_000)
    assert len(events(vad, audio, 16_000)) == 2  # espeak-ng is loud enough for it too


@pytest.mark.parametrize("rate", [24_000, 8_000])
def test_semantic_vad_ends_a_finished_sentence_after_a_short_pause(rate: int) -> None:
    vad = server_vad(VadSettings(type="semantic_vad"), rate)
    audio, end_ms = spoken(rate)
    started, _, stopped, _ = one_turn(events(vad, audio, rate))
    assert ONSET_MS - 300 <= started.audio_start_ms <= ONSET_MS - 300 + 150
    # Smart Turn, asked after medium eagerness's 300 ms pause, judged it finished: the
    # turn ends there, before server_vad's 500 ms and far before the 4 s longest wait.
    pause = EAGERNESS["auto"].pause_ms
    assert end_ms + pause - 50 <= stopped.audio_end_ms <= end_ms + pause + 200
    assert isinstance(vad.end_of_turn, turn_models.SmartTurn)
    assert vad.end_of_turn.last_probability is not None
    assert vad.end_of_turn.last_probability >= EAGERNESS["auto"].threshold


@pytest.mark.parametrize(
    ("eagerness", "waits_ms"), [("high", 2000), ("medium", 4000), ("low", 8000)]
)
def test_semantic_vad_waits_out_a_sentence_cut_mid_word(eagerness: str, waits_ms: int) -> None:
    rate = 16_000
    settings = VadSettings(type="semantic_vad", eagerness=eagerness)  # type: ignore[arg-type]
    vad = server_vad(settings, rate)
    audio, end_ms = spoken(rate, cut=0.5, after_ms=9000)
    _started, _, stopped, _ = one_turn(events(vad, audio, rate))
    assert isinstance(vad.end_of_turn, turn_models.SmartTurn)
    probability = vad.end_of_turn.last_probability
    assert probability is not None
    assert probability < EAGERNESS["high"].threshold
    # Not finished: the turn ends only after the eagerness's longest silence.
    assert end_ms + waits_ms - 200 <= stopped.audio_end_ms <= end_ms + waits_ms + 200


def test_speech_resuming_after_an_unfinished_pause_keeps_the_turn() -> None:
    rate = 16_000
    speech = say(SENTENCE, rate)
    half = speech.numel() // 2
    audio = torch.cat(
        [
            silence(ONSET_MS, rate),
            speech[:half],
            silence(1000, rate),  # a pause Smart Turn judges unfinished
            speech[half:],
            silence(2000, rate),
        ]
    )
    end_ms = ONSET_MS + 1000 + speech.numel() * 1000 // rate
    _, _, stopped, _ = one_turn(
        events(server_vad(VadSettings(type="semantic_vad"), rate), audio, rate)
    )
    pause = EAGERNESS["auto"].pause_ms
    assert end_ms + pause - 50 <= stopped.audio_end_ms <= end_ms + pause + 200


def test_the_models_load_from_their_wheels_without_running_the_packages() -> None:
    """The ONNX files are read where the wheels put them: silero_vad's and pipecat's
    code (torch.hub, downloads, loguru) never runs."""
    code = (
        "import sys\n"
        "from omni_actors.server.session_config import VadSettings\n"
        "from omni_actors.server.turns import server_vad\n"
        "server_vad(VadSettings(type='semantic_vad'), 16000)\n"
        "ran = sorted(m for m in sys.modules if m.split('.')[0] in ('silero_vad', 'pipecat'))\n"
        "assert not ran, ran\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
