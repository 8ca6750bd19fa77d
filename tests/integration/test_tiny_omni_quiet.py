"""Quiet by default: preparing, starting and running tiny-omni (a reply and a transcript)
writes none of transformers' warnings or progress bars, which are about the library's own
configuration and nothing a user can act on.

Run in a fresh interpreter: transformers warns once per process and its logging settings
are process-wide, so an earlier test in this one could hide a warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

_RUN = """
import asyncio, math, sys
from pathlib import Path

import torch

from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import load_pipeline
from omni_actors.protocols.events import ResponseDone, TranscriptDone, TranscriptFailed


async def main(cache: Path) -> None:
    spec = load_pipeline("tiny-omni").with_weights(cache_dir=cache)
    speech = torch.sin(torch.arange(16000) * 2 * math.pi * 220 / 16000) * 0.3
    async with OmniPipeline(spec) as omni:
        async with omni.session(modalities=("text",), transcription=True) as session:
            await session.transcribe()
            await session.send(audio=speech, sample_rate=16000)
            await session.commit(turn="plain")
            await session.transcribe(language="en", prompt="a tone")
            await session.send(audio=speech, sample_rate=16000)
            await session.commit(turn="prompted")
            await session.respond()
            ended, transcripts = 0, []
            while not ended or len(transcripts) < 2:
                event = await session.next_event()
                ended += isinstance(event, ResponseDone)
                if isinstance(event, TranscriptDone | TranscriptFailed):
                    transcripts.append(event)
    for event in transcripts:
        print(type(event).__name__, event.item, repr(getattr(event, "transcript", "")))


cache = Path(sys.argv[1])
prepare("tiny-omni", cache_dir=cache)
asyncio.run(main(cache))
"""


def test_a_reply_and_transcripts_write_nothing_from_transformers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "default"},
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert [line.split()[:2] for line in said] == [
        ["TranscriptDone", "plain"],
        ["TranscriptDone", "prompted"],
    ], done.stdout
    for unwanted in (
        "rope_parameters",  # the talker's mrope keys
        "it/s]",  # a tqdm bar: loading or writing weights
        "max_length",  # Whisper's generation defaults
        "generation_config",
        "[transformers]",  # anything else transformers says
    ):
        assert unwanted not in done.stderr, done.stderr
