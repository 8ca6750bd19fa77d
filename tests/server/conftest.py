"""Servers for the server tests: real sockets on 127.0.0.1, a fast scripted pipeline."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings

FAST = ServerSettings(preset="scripted-omni", port=0)

# ``chat_engines.Transcript`` shows the conversation it holds; ``Voice`` speaks its text.
TRANSCRIPT = PipelineSpec.model_validate(
    {
        "name": "transcript",
        "stages": [
            {"name": "transcript", "engine": {"kind": "chat_engines:Transcript"}},
            {"name": "voice", "engine": {"kind": "chat_engines:Voice"}},
        ],
        "edges": [{"from": "transcript", "to": "voice"}],
        "outputs": {"text": "transcript", "audio": "voice", "sample_rate": 24_000},
        "deadlines": {"idle_s": 30.0, "inter_chunk_s": 10.0},
    }
)


@pytest.fixture(autouse=True)
def energy_vad(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server tests speak synthetic "speech" (tones under noise, Chromium's fake
    microphone): Silero VAD rightly hears none in it, so they run the frame-energy VAD,
    as a server without the ``turns`` extra does. Tests marked ``real_speech`` (spoken by
    espeak-ng) run Silero VAD and Smart Turn."""
    if request.node.get_closest_marker("real_speech") is None:
        monkeypatch.setitem(sys.modules, "silero_vad", None)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[RunningServer]:
    async with run_server(FAST) as running:
        yield running


@pytest_asyncio.fixture
async def transcript() -> AsyncIterator[RunningServer]:
    """A server whose pipeline shows the conversation it holds (``TRANSCRIPT``)."""
    async with run_server(ServerSettings(port=0), pipeline=TRANSCRIPT) as running:
        yield running
