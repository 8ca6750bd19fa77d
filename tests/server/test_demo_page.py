"""The demo page at ``/``, in a real browser: speak into it, hear the reply.

Headless Debian Chromium opens the page served by ``omni-actors serve`` (in-process,
scripted-omni) and clicks Connect; its fake microphone plays a WAV of speech-like sound
then silence, looped, so the server's VAD ends a turn and answers. The page's own
bookkeeping (``window.omniDemo``) must show audio deltas played through its AudioContext,
a measured TTFA and no ``error`` event. The screenshot and that state are kept under the
test's tmp dir.
"""

from __future__ import annotations

import contextlib
import json
import wave
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import numpy as np
import pytest
from chromium_cdp import Chromium, DevTools, Page
from webrtc_engines import one_torch_thread, tone_pipeline

from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings
from omni_actors.testing.waiting import eventually

pytestmark = pytest.mark.integration

_MIC_RATE = 48000  # what a real microphone gives; the page resamples to 24 kHz


def write_speech_like_wav(path: Path, speech_s: float = 1.2, silence_s: float = 5.0) -> None:
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


@contextlib.asynccontextmanager
async def _connected_demo(
    server: RunningServer,
    chromium: Chromium,
    tmp_path: Path,
    api_key: str = "",
    path: str = "/?transport=websocket",
) -> AsyncIterator[DemoPage]:
    """The demo page of ``server`` at ``path`` (by default on the websocket, though the
    browser has WebRTC), ``api_key`` typed in, Connect clicked; on the way out its
    screenshot and ``omniDemo`` state are saved under ``tmp_path`` (pass or fail), and it
    disconnects (the server would wait for its responses when it stops)."""
    devtools = await DevTools.connect(chromium.devtools_url())
    try:
        page = await devtools.open_page()
        await page.navigate(urljoin(server.url, path))
        await eventually(
            lambda: page.evaluate("document.readyState === 'complete'"),
            timeout=30,
            what="the demo page loaded",
        )
        await page.evaluate(f"document.getElementById('api-key').value = {json.dumps(api_key)}")
        await page.evaluate("document.getElementById('connect').click()", user_gesture=True)
        try:
            yield DemoPage(page, devtools)
        finally:
            await page.screenshot(tmp_path / "demo.png")
            (tmp_path / "omni_demo.json").write_text(json.dumps(await _demo_state(page)))
            await page.evaluate(
                "['connecting', 'connected', 'ready'].includes(omniDemo.state)"
                " && document.getElementById('connect').click()"
            )
            await eventually(
                lambda: page.evaluate("['closed', 'disconnected'].includes(omniDemo.state)"),
                what="disconnected",
            )
    finally:
        await devtools.close()


class DemoPage:
    """The page under test, and what its state must show at every poll."""

    def __init__(self, page: Page, devtools: DevTools) -> None:
        self.page = page
        self.devtools = devtools

    async def state(self) -> dict[str, Any]:
        """``window.omniDemo``, which must show no error."""
        state = await _demo_state(self.page)
        if state["errors"]:  # no waiting for what cannot come
            pytest.fail(f"the page shows errors: {state['errors']}")
        return state

    async def wait_for_state(self, name: str) -> None:
        """Wait until the page's connection state is ``name``."""

        async def reached() -> Any:
            state = await self.state()
            assert state["state"] == name, f"{state}; console: {self.devtools.console}"
            return state

        await eventually(reached, timeout=30, what=f"the page's state is {name}")

    async def wait_for_turn(self, holds: Callable[[dict[str, Any]], bool], what: str) -> Any:
        """The first turn for which ``holds(turn)``, and the page's state then."""

        async def found() -> tuple[dict[str, Any], dict[str, Any]]:
            state = await self.state()
            turns = [turn for turn in state["turns"] if holds(turn)]
            assert turns, f"{state}; console: {self.devtools.console}"
            return turns[0], state

        return await eventually(found, timeout=60, what=what)


def _heard(turn: dict[str, Any]) -> bool:
    """A turn whose audio reached the speakers, with its TTFA measured."""
    return bool(turn["samplesPlayed"]) and turn["ttfaMs"] is not None


def _audio_left(turn: dict[str, Any]) -> bool:
    """Whether some of the turn's audio is still scheduled (neither played nor cut)."""
    return turn["heardMs"] is None and turn["samplesPlayed"] < turn["samplesReceived"]


async def test_demo_page_plays_the_reply_to_speech(
    server: RunningServer, chromium: Chromium, tmp_path: Path
) -> None:
    async with _connected_demo(server, chromium, tmp_path) as demo:
        turn, state = await demo.wait_for_turn(_heard, "a reply played")
        assert state["state"] == "ready"
        assert state["audioDeltasPlayed"] >= 1
        assert turn["responseId"]
        assert turn["audioDeltas"] > 0
        assert turn["ttfaMs"] >= 0
        assert 0 < turn["samplesPlayed"] <= turn["samplesReceived"] <= state["samplesScheduled"]
        # Played on: the whole reply, every sample once, unless speech cut it short.
        turn, _ = await demo.wait_for_turn(
            lambda t: t["status"] != "in_progress" and not _audio_left(t),
            "the reply played to its end or was cut",
        )
        if turn["heardMs"] is None:
            assert turn["samplesPlayed"] == turn["samplesReceived"]
    assert (tmp_path / "demo.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((tmp_path / "omni_demo.json").read_text())["errors"] == []


async def test_stop_cuts_the_reply_and_truncates_it_to_what_was_heard(
    server: RunningServer, chromium: Chromium, tmp_path: Path
) -> None:
    async with _connected_demo(server, chromium, tmp_path) as demo:
        await demo.wait_for_turn(_heard, "a reply playing")
        await demo.page.evaluate("document.getElementById('stop').click()", user_gesture=True)
        turn, _ = await demo.wait_for_turn(
            lambda t: t["truncatedMs"] is not None, "the server truncated the reply"
        )
        # Cut short: what was heard of it, not all that arrived, and the server agrees.
        assert turn["samplesPlayed"] < turn["samplesReceived"]
        assert turn["heardMs"] == turn["samplesPlayed"] * 1000 // 24000
        assert turn["truncatedMs"] == turn["heardMs"]
        assert turn["status"] in ("completed", "cancelled")


async def test_demo_page_presents_the_api_key_typed_in(chromium: Chromium, tmp_path: Path) -> None:
    # The server refuses a browser without the key at the handshake: a session that gets
    # as far as session.updated proves the page offered it (the subprotocol browsers use).
    settings = ServerSettings(preset="scripted-omni", port=0, api_key="sk-demo-123")
    async with (
        run_server(settings) as server,
        _connected_demo(server, chromium, tmp_path, api_key="sk-demo-123") as demo,
    ):
        await demo.wait_for_state("ready")


async def test_the_page_says_the_microphone_needs_https_when_it_is_not_a_secure_context(
    tmp_path: Path,
) -> None:
    # A name other than localhost, served over plain http: what a browser on another
    # machine gets. Chromium maps the name to this machine's loopback itself.
    wav = tmp_path / "mic.wav"
    write_speech_like_wav(wav)
    rules = "--host-resolver-rules=MAP omni-demo.test 127.0.0.1"
    with Chromium(wav, tmp_path / "chromium.log", (rules,)) as browser:
        settings = ServerSettings(preset="scripted-omni", port=0)
        async with run_server(settings) as server:
            port = server.url.rsplit(":", 1)[1]
            devtools = await DevTools.connect(browser.devtools_url())
            try:
                page = await devtools.open_page()
                await page.navigate(f"http://omni-demo.test:{port}/")
                await eventually(
                    lambda: page.evaluate("document.readyState === 'complete'"),
                    timeout=30,
                    what="the demo page loaded",
                )
                assert await page.evaluate("window.isSecureContext") is False
                notice = await page.evaluate("document.getElementById('notice').textContent")
                assert "needs https or localhost" in notice
                assert "--ssl-certfile" in notice
                await page.evaluate("document.getElementById('connect').click()", user_gesture=True)

                async def refused() -> list[str]:
                    errors: list[str] = (await _demo_state(page))["errors"]
                    assert errors
                    return errors

                errors = await eventually(refused, timeout=30, what="the connect refused")
                assert all("getUserMedia" not in error for error in errors), errors
                assert "needs https or localhost" in errors[0]
                assert await page.evaluate("omniDemo.state") == "disconnected"
            finally:
                await devtools.close()


@pytest.fixture
def barging_chromium(tmp_path: Path) -> Iterator[Chromium]:
    """A browser whose microphone speaks again 3 s after it stops: over a reply longer
    than that (``webrtc_engines``' 5.12 s tone), a barge-in."""
    wav = tmp_path / "mic.wav"
    write_speech_like_wav(wav, silence_s=3.0)
    browser = Chromium(wav, tmp_path / "chromium.log")
    try:
        browser.devtools_url()
        with one_torch_thread():  # the server runs as `serve` runs it
            yield browser
    finally:
        browser.close()


async def test_the_page_calls_over_webrtc_with_an_ephemeral_key_and_speech_cuts_the_reply(
    barging_chromium: Chromium, tmp_path: Path
) -> None:
    # The server needs a key: the page buys an ephemeral one with the key typed in, and
    # the call opens with that. The reply is a tone (scripted-omni's audio is a constant
    # per frame, which Opus takes out), played on the server's track.
    settings = ServerSettings(port=0, api_key="sk-demo-123")
    async with (
        run_server(settings, pipeline=tone_pipeline()) as server,
        _connected_demo(server, barging_chromium, tmp_path, "sk-demo-123", "/") as demo,
    ):
        await demo.wait_for_state("ready")
        state = await demo.state()
        assert (state["transport"], state["ephemeralKey"]) == ("webrtc", True)
        assert len(server.state.client_secrets) == 1
        assert len(server.state.calls) == 1

        async def heard() -> dict[str, Any]:
            state = await demo.state()
            rtc = state["rtc"]
            assert rtc, f"{state}"
            assert rtc["totalAudioEnergy"] > 0.001, f"{state}"  # silence's is 0
            assert state["transcript"], f"{state}"
            assert state["transcript"][0]["text"].startswith("t0 t1 ")
            return state

        await eventually(heard, timeout=60, what="the reply heard from the server's track")
        # The microphone speaks again over the reply: the server cuts it where it was
        # heard, with no truncate from the page (a call's page sends none).
        turn, _ = await demo.wait_for_turn(
            lambda t: t["truncatedMs"] is not None, "the server cut the reply"
        )
        assert 0 < turn["truncatedMs"] < 32 * 160
        assert turn["heardMs"] is None  # the page measured nothing: the server did
    assert len(server.state.calls) == 0
