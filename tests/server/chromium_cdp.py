"""Headless Debian Chromium, driven over the Chrome DevTools Protocol (CDP).

Just enough of a browser driver for the demo page's test: start ``chromium`` with a fake
microphone that plays a WAV file, open a page, evaluate JavaScript, take a screenshot.
It speaks CDP over the ``websockets`` library the server already depends on, so the
suite needs no Playwright and no browser download: only the distribution's package.

:class:`Chromium` owns the browser's process group and profile directory, and takes
both away on :meth:`Chromium.close` whatever state the browser is in; :class:`DevTools`
is one CDP connection, and :class:`Page` one tab attached to it (flat sessions: every
command names the tab's ``sessionId`` on the browser's one websocket).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

__all__ = ["CdpError", "Chromium", "DevTools", "Page"]

_START_S = 30.0  # a cold start on a loaded 2-core machine takes a few seconds
_STOP_S = 10.0
_CALL_S = 30.0


class CdpError(RuntimeError):
    """A CDP command answered with an error, or the page threw."""


def _browser_processes(pgid: int | None, profile_dir: Path) -> list[int]:
    """Live processes of the browser (zombies excluded), read from /proc.

    That is its process group (``pgid``; None once the browser is reaped), plus anything
    whose command line names its profile: Chromium's crashpad handlers start sessions of
    their own, and name the profile (where ``XDG_CONFIG_HOME`` puts their database).
    """
    marker = str(profile_dir).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        state, group = fields[0], int(fields[2])
        if state != "Z" and (group == pgid or marker in cmdline):
            found.append(int(entry))
    return found


class Chromium:
    """A headless ``chromium`` whose microphone plays ``fake_mic_wav`` (looped).

    The browser runs in a process group of its own (its zygote, renderers and utility
    processes stay in it), so :meth:`close` can end all of them at once.

    Args:
        fake_mic_wav: what getUserMedia hears; Chromium loops it.
        log_path: the browser's stdout and stderr, for when a test fails.
        extra_args: more command-line switches (``--host-resolver-rules=...``).
    """

    def __init__(
        self, fake_mic_wav: Path, log_path: Path, extra_args: tuple[str, ...] = ()
    ) -> None:
        executable = shutil.which("chromium")
        if executable is None:
            raise RuntimeError(
                "Debian's chromium is not installed: run `make test` (it installs it) or "
                "`apt-get install -y chromium`"
            )
        self.profile_dir = Path(tempfile.mkdtemp(prefix="omni-chromium-"))
        self._log = log_path.open("wb")
        args = [
            executable,
            "--headless",
            "--no-sandbox",  # root in a container: the setuid sandbox cannot start
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1000,900",  # the screenshot shows the whole demo page
            f"--user-data-dir={self.profile_dir}",
            "--remote-debugging-port=0",  # any free port, written to DevToolsActivePort
            "--use-fake-ui-for-media-stream",  # grants getUserMedia without a prompt
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={fake_mic_wav}",
            "--autoplay-policy=no-user-gesture-required",
            *extra_args,
            "about:blank",
        ]
        try:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Chromium's config and crash database go under the profile, not ~/.config.
                env={**os.environ, "XDG_CONFIG_HOME": str(self.profile_dir)},
            )
        except BaseException:
            self._remove_profile()
            raise

    def devtools_url(self, timeout: float = _START_S) -> str:
        """The browser's CDP websocket URL, once Chromium has written it.

        Chromium picks the port itself (``--remote-debugging-port=0``) and writes it, with
        the browser target's path, to ``DevToolsActivePort`` in the profile.
        """
        port_file = self.profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while True:
            lines = port_file.read_text().split() if port_file.exists() else []
            if len(lines) == 2:
                return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium wrote no {port_file} within {timeout:g}s")
            time.sleep(0.05)  # polling a file another process writes: no event to wait on

    def close(self) -> None:
        """End every process of the browser and remove its profile; safe to call twice."""
        try:
            self._stop()
        finally:
            self._remove_profile()

    def _stop(self) -> None:
        # Once the browser is reaped its pid may be another process's: from then on its
        # processes are found by the profile their command lines name.
        pgid = None if self.process.returncode is not None else self.process.pid
        if pgid is not None:  # start_new_session: the group's id is the browser's pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                self.process.wait(timeout=_STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                self.process.wait(timeout=_STOP_S)
        # Processes the browser did not take down with it (they are init's now).
        deadline = time.monotonic() + _STOP_S
        while left := _browser_processes(pgid, self.profile_dir):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"chromium processes {left} survived SIGKILL")
            time.sleep(0.01)  # polling /proc: a process that is not our child has no event

    def _remove_profile(self) -> None:
        self._log.close()
        shutil.rmtree(self.profile_dir, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class DevTools:
    """One CDP connection to the browser target; commands go one at a time.

    A command's reply is read off the socket by the command itself (no reader task):
    events that arrive meanwhile are kept in :attr:`console` when they are the page's
    console output or uncaught exceptions, and dropped otherwise.
    """

    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self.console: list[str] = []

    @classmethod
    async def connect(cls, url: str) -> DevTools:
        """Open a connection to ``url`` (:meth:`Chromium.devtools_url`)."""
        # Screenshots come back base64 in one message: well over websockets' 1 MiB default.
        return cls(await connect(url, max_size=64 * 1024 * 1024, open_timeout=_CALL_S))

    async def close(self) -> None:
        """Close the connection (the browser keeps running)."""
        await self._socket.close()

    async def call(
        self, method: str, session_id: str | None = None, timeout: float = _CALL_S, **params: Any
    ) -> dict[str, Any]:
        """Send one command and return its ``result``.

        Raises:
            CdpError: the browser answered with an error.
            TimeoutError: no answer within ``timeout``.
        """
        message_id = next(self._ids)
        command: dict[str, Any] = {"id": message_id, "method": method, "params": params}
        if session_id is not None:
            command["sessionId"] = session_id
        async with asyncio.timeout(timeout):
            await self._socket.send(json.dumps(command))
            while True:
                message = json.loads(await self._socket.recv())
                if message.get("id") == message_id:
                    break
                self._keep(message)
        if "error" in message:
            raise CdpError(f"{method}: {message['error']}")
        result: dict[str, Any] = message["result"]
        return result

    def _keep(self, event: dict[str, Any]) -> None:
        params = event.get("params", {})
        if event.get("method") == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.console.append(f"console.{params['type']}: {text}")
        elif event.get("method") == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.console.append(f"exception: {details.get('exception', {}).get('description')}")

    async def open_page(self) -> Page:
        """A new tab, attached, with its console reported to :attr:`console`."""
        target = await self.call("Target.createTarget", url="about:blank")
        attached = await self.call(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        page = Page(self, attached["sessionId"])
        await page.call("Runtime.enable")
        return page


class Page:
    """One tab: navigate, evaluate, screenshot."""

    def __init__(self, devtools: DevTools, session_id: str) -> None:
        self._devtools = devtools
        self._session_id = session_id

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """A CDP command for this tab."""
        return await self._devtools.call(method, session_id=self._session_id, **params)

    async def navigate(self, url: str) -> None:
        """Load ``url``; returns once the navigation is committed (not yet loaded)."""
        result = await self.call("Page.navigate", url=url)
        if "errorText" in result:
            raise CdpError(f"navigating to {url}: {result['errorText']}")

    async def evaluate(self, expression: str, user_gesture: bool = False) -> Any:
        """The value of ``expression`` (JSON-serialisable), awaited if it is a promise.

        ``user_gesture`` runs it as if the user clicked: what a page needs to open a
        microphone or start audio without the command-line autoplay flag.
        """
        result = await self.call(
            "Runtime.evaluate",
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
            userGesture=user_gesture,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CdpError(f"{expression!r} threw: {details.get('exception', details)}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        """Write a PNG of what the tab shows to ``path``."""
        result = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(result["data"]))
