"""The demo page at ``/``, in a real browser: speak into it, hear the reply.

Headless Debian Chromium opens the page served by ``omni-actors serve`` (in-process,
scripted-omni) and clicks Connect; its fake microphone plays a WAV of speech-like sound
then silence, looped, so the server's VAD ends a turn and answers. The page's own
bookkeeping (``window.omniDemo``) must show audio deltas played through its AudioContext,
a measured TTFA and no ``error`` event. The screenshot and that state are kept under the
test's tmp dir.
"""

from __future__ import annotations

import json
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import numpy as np
import pytest
from chromium_cdp import Chromium, DevTools, Page

from omni_actors.server import ServerSettings
from omni_actors.server.runner import run_server
from omni_actors.testing.waiting import eventually

pytestmark = pytest.mark.integration

_MIC_RATE = 48000  # what a real microphone gives; the page resamples to 24 kHz


def write_speech_like_wav(path: Path, speech_s: float = 1.2, silence_s: float = 2.0) -> None:
    """A voiced sound (harmonics of a gliding 140 Hz pitch, syllable-rate loudness) then
    silence: loud enough for an energy VAD, and not the stationary noise that the
    browser's noise suppression would take out. 48 kHz mono PCM16."""
    t = np.arange(int(speech_s * _MIC_RATE)) / _MIC_RATE
    pitch = 140 + 20 * np.sin(2 * np.pi * 1.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / _MIC_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 20))
    syllables = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)
    speech = voiced * syllables
    speech = 0.5 * speech / np.abs(speech).max()
    samples = np.concatenate([speech, np.zeros(int(silence_s * _MIC_RATE))])
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(_MIC_RATE)
        out.writeframes((samples * 32767).astype("<i2").tobytes())


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Chromium]:
    """A headless browser whose microphone plays speech then silence; gone afterwards."""
    wav = tmp_path / "mic.wav"
    write_speech_like_wav(wav)
    browser = Chromium(wav, tmp_path / "chromium.log")
    try:
        browser.devtools_url()  # started and listening, before the test's clock runs
        yield browser
    finally:
        browser.close()


async def _demo_state(page: Page) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(await page.evaluate("JSON.stringify(window.omniDemo)"))
    return state


def _heard(turn: dict[str, Any]) -> bool:
    """A turn whose audio reached the speakers, with its TTFA measured."""
    return bool(turn["samplesPlayed"]) and turn["ttfaMs"] is not None


async def test_demo_page_plays_the_reply_to_speech(chromium: Chromium, tmp_path: Path) -> None:
    async with run_server(ServerSettings(preset="scripted-omni", port=0)) as server:
        devtools = await DevTools.connect(chromium.devtools_url())
        try:
            page = await devtools.open_page()
            await page.navigate(urljoin(server.url, "/"))
            await eventually(
                lambda: page.evaluate("document.readyState === 'complete'"),
                timeout=30,
                what="the demo page loaded",
            )
            await page.evaluate("document.getElementById('connect').click()", user_gesture=True)

            async def reply_heard() -> dict[str, Any]:
                state = await _demo_state(page)
                assert not state["errors"], f"the page shows errors: {state['errors']}"
                assert any(_heard(turn) for turn in state["turns"]), (
                    f"no reply played yet: {state}; console: {devtools.console}"
                )
                return state

            try:
                state = await eventually(reply_heard, timeout=60, what="a reply played")
            finally:
                await page.screenshot(tmp_path / "demo.png")
                (tmp_path / "omni_demo.json").write_text(json.dumps(await _demo_state(page)))
        finally:
            await devtools.close()

    assert state["state"] == "ready"
    assert state["errors"] == []
    assert state["audioDeltasPlayed"] >= 1
    played = sum(turn["samplesPlayed"] for turn in state["turns"])
    assert 0 < played <= state["samplesScheduled"]
    heard = next(turn for turn in state["turns"] if _heard(turn))
    assert heard["responseId"]
    assert heard["audioDeltas"] > 0
    assert heard["ttfaMs"] >= 0
    assert (tmp_path / "demo.png").read_bytes().startswith(b"\x89PNG")
