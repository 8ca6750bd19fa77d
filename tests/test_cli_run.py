"""``omni-actors run`` and ``prepare``: output, exit codes, and clear one-line errors."""

from __future__ import annotations

import importlib.metadata
import os
import struct
import subprocess
import sys
import wave
from pathlib import Path

import pytest
import torch

import omni_actors
from omni_actors.audio.wav import write_wav
from omni_actors.cli import main


def test_run_streams_text_writes_a_wav_and_prints_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "reply.wav"
    assert main(["run", "--preset", "scripted-omni", "--text", "hi", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("t0 t1 t2 ")
    assert "TTFT " in printed
    assert "TTFA " in printed
    assert "RTF " in printed
    assert "end-to-end " in printed
    with wave.open(str(out)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
        assert wav.getnframes() == 32 * 2 * 1920


def test_run_takes_audio_at_any_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_wav(tmp_path / "in.wav", torch.zeros(44100), 44100)
    out = tmp_path / "reply.wav"
    argv = ["run", "--preset", "scripted-omni", "--audio", str(tmp_path / "in.wav")]
    assert main([*argv, "--out", str(out)]) == 0
    assert out.stat().st_size > 44


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "nope", "--text", "x"], "no preset named 'nope'"),
        (["--preset", "scripted-omni"], "give --text, --audio or both"),
        (["--preset", "scripted-omni", "--audio", "missing.wav"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["run", *argv, "--out", str(tmp_path / "o.wav")]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def _wav_header(tag: int, channels: int, rate: int, bits: int, frames: int) -> bytes:
    """A WAVE_FORMAT_EXTENSIBLE header (sub-format ``tag``) for ``frames`` frames."""
    block = channels * bits // 8
    guid = struct.pack("<H", tag) + bytes.fromhex("000000001000800000aa00389b71")
    fmt = struct.pack("<HHIIHHHHI", 0xFFFE, channels, rate, rate * block, block, bits, 22, bits, 3)
    fmt += guid
    data = frames * block
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(fmt) + 8 + data)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", data)
    )


def test_run_takes_float_and_extensible_wavs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stereo = torch.sin(torch.arange(2 * 48000) / 20.0).numpy().astype("<f4") * 0.5
    wav = tmp_path / "float.wav"
    wav.write_bytes(_wav_header(3, 2, 48000, 32, 48000) + stereo.tobytes())
    out = tmp_path / "reply.wav"
    argv = ["run", "--preset", "scripted-omni", "--audio", str(wav), "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert out.stat().st_size > 44
    capsys.readouterr()
    alaw = tmp_path / "alaw.wav"
    alaw.write_bytes(_wav_header(6, 1, 8000, 8, 800) + bytes(800))
    argv = ["run", "--preset", "scripted-omni", "--audio", str(alaw), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "A-law audio is not supported" in err
    assert len(err.strip().splitlines()) == 1


def test_version_prints_the_installed_distributions_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    version = importlib.metadata.version("omni-actors")
    assert capsys.readouterr().out == f"omni-actors {version}\n"


def test_a_garbage_wav_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.wav").write_bytes(b"RIFF....garbage")
    argv = ["run", "--preset", "scripted-omni", "--audio", str(tmp_path / "bad.wav")]
    assert main([*argv, "--out", str(tmp_path / "o.wav")]) == 2
    assert "not a PCM WAV file" in capsys.readouterr().err


def test_the_run_command_does_not_shadow_the_loop_runner(tmp_path: Path) -> None:
    import omni_actors
    from omni_actors.cli import bench

    assert (
        main(["run", "--preset", "scripted-omni", "--text", "x", "--out", str(tmp_path / "o.wav")])
        == 0
    )
    # A submodule named like an attribute of its package replaces it on import: the
    # bench commands, which call ``run``, broke after a ``run`` command once.
    assert bench.run is omni_actors.run


def test_prepare_offers_the_installed_model_families(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["prepare", "gpt-17"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gpt-17'" in err
    assert "'tiny-omni'" in err  # registered under the omni_actors.families entry point


MY_ENGINES = """
from collections.abc import AsyncIterator


class Shout:
    inputs = {"text": "concat"}
    outputs = {"text": "concat"}

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator) -> AsyncIterator:
        async for chunk in inputs:
            yield {"text": chunk["text"].upper()}
        yield {"text": "!!"}
"""

MY_PIPELINE = """
name: shouting
stages:
  - {name: thinker, engine: {kind: scripted, args: {outputs: 3}}}
  - {name: shout, process: true, engine: {kind: "my_engines:Shout"}}
edges:
  - {from: thinker, to: shout}
outputs: {text: shout}
"""


def test_run_finds_engines_in_the_current_directory_in_every_process(tmp_path: Path) -> None:
    (tmp_path / "my_engines.py").write_text(MY_ENGINES)
    (tmp_path / "my_pipeline.yaml").write_text(MY_PIPELINE)
    # Only this package on the path, as an installed one would be: not the directory the
    # command runs in. PYTHONSAFEPATH keeps every Python process (``-m`` included) from
    # adding it on its own, as for the ``omni-actors`` script: the worker that runs the
    # engine finds it only if the command passes its path on.
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(omni_actors.__file__).parents[1]),
        "PYTHONSAFEPATH": "1",
    }
    argv = ["run", "--preset", "my_pipeline.yaml", "--text", "hi", "--out", "reply.wav"]
    done = subprocess.run(
        [sys.executable, "-m", "omni_actors.cli", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("T0 T1 T2 !!"), done.stdout
    assert "1 in worker processes" in done.stderr
    assert (tmp_path / "reply.wav").exists()
