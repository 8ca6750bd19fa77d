"""Every example runs to completion on its own and exits 0."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from omni_actors.testing import eventually

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
KEY = "example-key"
SAID = "Hello there. Could you tell me what time it is?"


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WAV of speech (espeak-ng, ``make speech``): the servers run Silero VAD, which
    hears no turn in the examples' default tone, as a real deployment would."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (make speech, or apt-get install espeak-ng)")
    path = tmp_path_factory.mktemp("speech") / "said.wav"
    subprocess.run([espeak, "-v", "en", "-s", "160", "-w", str(path), SAID], check=True)
    return path


SERVER_READY_S = 120.0


def run_example(name: str, *args: str, timeout: float = 60, **env: str) -> str:
    """Run ``examples/<name>`` in a fresh interpreter; its stdout, once it exited 0."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_supervised_pipeline_restarts_the_failed_stage_and_finishes() -> None:
    stdout = run_example("supervised_pipeline.py")
    assert "transform restarted after ValueError('cannot decode chunk 3')" in stdout
    # Chunk 3 crashed the stage and is gone; the chunks queued behind it survived.
    assert "sink got: THE FIRST AUDIO LEAVES EARLY" in stdout
    assert stdout.rstrip().endswith("shut down cleanly")


def test_voice_agent_answers_two_turns_and_barges_in_on_the_third() -> None:
    lines = run_example("voice_agent.py").splitlines()
    assert lines[0].startswith("turn 1: 32 text pieces, 5.12s audio, TTFT ")
    assert lines[1].startswith("turn 2: 32 text pieces, 5.12s audio, TTFT ")
    assert lines[2].startswith("turn 3: cancelled after ")
    assert lines[3].startswith("turn 4: 32 text pieces, 5.12s audio, TTFT ")
    assert lines[-1] == "pipeline closed cleanly"


def test_voice_agent_runs_on_tiny_omni(tmp_path: Path) -> None:
    lines = run_example(
        "voice_agent.py", "tiny-omni", timeout=120, OMNI_ACTORS_CACHE=str(tmp_path)
    ).splitlines()
    assert lines[0].startswith("turn 1: ")
    assert lines[1].startswith("turn 2: ")
    assert lines[2].startswith("turn 3: cancelled after ")
    assert lines[3].startswith("turn 4: ")
    assert lines[-1] == "pipeline closed cleanly"


# The realtime examples: clients of a server the test starts, on 127.0.0.1 only.


def _ready(url_file: Path, server: subprocess.Popen[bytes]) -> str:
    """The server's realtime URL once ``/readyz`` answers 200; "" (not yet) before."""
    assert server.poll() is None, f"omni-actors serve exited {server.returncode}"
    url = url_file.read_text().strip() if url_file.is_file() else ""
    if not url:
        return ""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
            ready = response.status == 200
    except OSError:
        return ""
    return url.replace("http", "ws", 1) + "/v1/realtime" if ready else ""


def serve(directory: Path, preset: str, cwd: Path) -> Iterator[str]:
    """``omni-actors serve --preset PRESET --api-key KEY`` on a free port of 127.0.0.1,
    run in ``cwd``; its realtime URL, until the generator is closed."""
    url_file = directory / "url"
    with (directory / "log").open("wb") as log:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "omni_actors.cli", "serve", "--preset", preset),
                *("--host", "127.0.0.1", "--port", "0", "--api-key", KEY),
                *("--ready-file", str(url_file), "--cache-dir", str(directory / "cache")),
                *("--log-level", "warning"),
            ],
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield asyncio.run(
                eventually(lambda: _ready(url_file, process), SERVER_READY_S, "the server")
            )
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The scripted-omni preset served: every reply is 32 text pieces and 5.12 s of audio."""
    directory = tmp_path_factory.mktemp("scripted")
    yield from serve(directory, "scripted-omni", directory)


@pytest.fixture(scope="module")
def parrot_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``examples/parrot.yaml`` served from ``examples/``, as its docstring says to."""
    yield from serve(tmp_path_factory.mktemp("parrot"), "parrot.yaml", EXAMPLES)


def wav_seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as f:
        assert (f.getnchannels(), f.getsampwidth(), f.getframerate()) == (1, 2, 24_000)
        return f.getnframes() / 24_000


SCRIPTED_TRANSCRIPT = "transcript: " + " ".join(f"t{i}" for i in range(32))


def test_realtime_client_speaks_a_turn_and_writes_the_reply(
    scripted_server: str, speech: Path, tmp_path: Path
) -> None:
    out = tmp_path / "reply.wav"
    lines = run_example(
        "realtime_client.py",
        scripted_server,
        "--api-key",
        KEY,
        "--wav",
        str(speech),
        "--out",
        str(out),
    ).splitlines()
    assert lines[0] == f"reply completed: 5.12 s of audio -> {out}"
    assert lines[1].rstrip() == SCRIPTED_TRANSCRIPT
    assert wav_seconds(out) == pytest.approx(5.12)


def test_realtime_client_takes_the_key_from_the_environment(
    scripted_server: str, speech: Path, tmp_path: Path
) -> None:
    out = tmp_path / "reply.wav"
    stdout = run_example(
        "realtime_client.py",
        scripted_server,
        "--wav",
        str(speech),
        "--out",
        str(out),
        OMNI_ACTORS_API_KEY=KEY,
    )
    assert stdout.startswith("reply completed: 5.12 s")


@pytest.mark.parametrize(
    ("name", "client"),
    [
        ("pipecat_agent.py", "pipecat.services.openai.realtime.llm"),
        ("livekit_agent.py", "livekit.plugins.openai.realtime"),
    ],
)
def test_a_framework_agent_gets_its_reply_from_the_server(
    name: str, client: str, scripted_server: str, speech: Path, tmp_path: Path
) -> None:
    pytest.importorskip(
        client, reason="needs the integrations extra: pip install omni-actors[integrations]"
    )
    out = tmp_path / "reply.wav"
    lines = run_example(
        name,
        scripted_server,
        "--api-key",
        KEY,
        "--wav",
        str(speech),
        "--out",
        str(out),
        timeout=120,
    ).splitlines()
    assert lines[-2] == f"reply: 5.12 s of audio -> {out}"
    assert lines[-1].rstrip() == SCRIPTED_TRANSCRIPT
    assert wav_seconds(out) == pytest.approx(5.12)


def test_a_custom_engine_is_served_to_a_realtime_client(
    parrot_server: str, speech: Path, tmp_path: Path
) -> None:
    # Speech at another rate, in stereo: the client makes 24 kHz mono of it.
    said = tmp_path / "said.wav"
    with wave.open(str(speech), "rb") as f:
        rate = f.getframerate()
        mono = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    with wave.open(str(said), "wb") as f:
        f.setnchannels(2)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(np.repeat(mono, 2).tobytes())
    out = tmp_path / "reply.wav"
    lines = run_example(
        "realtime_client.py",
        parrot_server,
        "--api-key",
        KEY,
        "--wav",
        str(said),
        "--out",
        str(out),
    ).splitlines()
    # The parrot plays back the turn the server's VAD gave it, and says how long it was.
    assert lines[0].startswith("reply completed: ")
    heard = float(lines[1].removeprefix("transcript: I heard ").split()[0])
    assert heard >= 0.8
    assert wav_seconds(out) == pytest.approx(heard, abs=0.05)
