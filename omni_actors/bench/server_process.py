"""``ServerProcess``: the bench's realtime server in a process it owns, and its CPU time.

The server runs in a session of its own (``start_new_session``), so the server and
every worker it starts share one process group and one session id: stopping it can
reach every one of them, and its CPU time is the sum over the processes of that
session, read from ``/proc/PID/stat`` (no psutil). Stopping is SIGTERM (the server
drains and stops its workers), then, past a deadline, SIGKILL to the whole group, on
every path out of :func:`server_process`, failures included: nothing is left behind.

A client's close returns before the server has freed its session (the stages drop it,
then its slot is given back), so a step that opens as many sessions as the server
takes must first wait for the last step's to be freed: :meth:`ServerProcess.wait_idle`
reads ``/readyz``'s session count until it is zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_actors.errors import OmniError

__all__ = [
    "API_KEY_ENV",
    "CpuSnapshot",
    "ServerBusyError",
    "ServerProcess",
    "ServerStartError",
    "cpu_snapshot",
    "running_server",
    "server_process",
]

log = logging.getLogger(__name__)

API_KEY_ENV = "OMNI_ACTORS_API_KEY"
"""Where ``bench realtime --url`` finds the server's key when ``--api-key`` is not given."""
_POLL_S = 0.05  # how often the ready file and the process's exit are looked for
_LOG_TAIL = 2000
_PROBE_TIMEOUT_S = 5.0  # one /readyz request (the server asks its stages within 2 s)


class ServerStartError(OmniError):
    """The bench's server exited or did not become ready in time (the message carries
    the end of its log)."""


class ServerBusyError(OmniError, TimeoutError):
    """The bench's server still held sessions when a step needed it free of them."""


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """CPU seconds (user + system) of a server and its workers at one moment.

    Attributes:
        own: the server process itself, all its threads (the asyncio server and every
            stage that runs in its process).
        reaped: what the server's children that ended and were reaped used.
        workers: per other live process of the server's session, its own seconds.
    """

    own: float
    reaped: float
    workers: dict[int, float]

    def since(self, earlier: CpuSnapshot) -> tuple[float, float]:
        """``(own, with_workers)``: CPU seconds spent between ``earlier`` and now.

        A worker that started in between counts from zero. One that ended in between
        (a crashed stage's worker) counts through the server's reaped-children time,
        which holds its whole life, so what it had used by ``earlier`` is taken off.
        """
        own = self.own - earlier.own
        workers = sum(cpu - earlier.workers.get(pid, 0.0) for pid, cpu in self.workers.items())
        ended = sum(cpu for pid, cpu in earlier.workers.items() if pid not in self.workers)
        return own, own + workers + (self.reaped - earlier.reaped) - ended


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (proc(5) field 3 on),
    or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


# proc(5) fields 6 (session), 14-17 (utime, stime, cutime, cstime), counted from
# field 3 (state), the first one after the command name.
_SESSION, _UTIME, _STIME, _CUTIME, _CSTIME = 3, 11, 12, 13, 14


def cpu_snapshot(pid: int) -> CpuSnapshot | None:
    """The CPU time of process ``pid`` and of every other process in its session (see
    :class:`CpuSnapshot`); None where ``/proc`` cannot tell (not Linux, or gone)."""
    own = _stat(pid)
    if own is None:
        return None
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    workers: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pid:
            continue
        fields = _stat(int(entry))
        if fields is not None and fields[_SESSION] == own[_SESSION]:
            workers[int(entry)] = (int(fields[_UTIME]) + int(fields[_STIME])) * tick
    return CpuSnapshot(
        own=(int(own[_UTIME]) + int(own[_STIME])) * tick,
        reaped=(int(own[_CUTIME]) + int(own[_CSTIME])) * tick,
        workers=workers,
    )


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """A started bench server.

    Attributes:
        url: its base URL.
        ws_url: its realtime websocket URL.
        pid: the server process (its session's leader); None for a server the bench
            did not start (:func:`running_server`), whose CPU time it cannot read.
        api_key: the key its clients present (``Authorization: Bearer``), if it takes one.
    """

    url: str
    ws_url: str
    pid: int | None
    api_key: str | None = None

    def cpu(self) -> CpuSnapshot | None:
        """The server's CPU time so far (None where ``/proc`` cannot tell, or for a
        server the bench did not start)."""
        return None if self.pid is None else cpu_snapshot(self.pid)

    async def wait_idle(self, timeout_s: float) -> None:
        """Until the server holds no session (``/readyz``: ``sessions.active`` is 0).

        Sessions whose clients have left count until the server has freed them, and a
        full server refuses a new one (``busy``): a step that opens as many sessions as
        the server takes waits here first (see the module docstring).

        Raises:
            ServerBusyError: the server still held sessions after ``timeout_s``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (held := await asyncio.to_thread(_sessions_held, self.url)) != 0:
            if loop.time() >= deadline:
                what = f"{held} held" if isinstance(held, int) else held
                raise ServerBusyError(
                    f"the bench server had not freed its sessions {timeout_s:g}s after "
                    f"their clients left ({what}): a session that does not end, or a "
                    "server too slow for --timeout-s"
                )
            await asyncio.sleep(_POLL_S)


def _sessions_held(url: str) -> int | str:
    """How many session slots the server at ``url`` holds (``/readyz``), or why that
    could not be read. A 503 (a stage restarting) still tells."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=_PROBE_TIMEOUT_S) as reply:
            body = reply.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except OSError as exc:  # refused, reset, timed out: the server is gone or stuck
        return f"/readyz did not answer: {exc}"
    try:
        active = json.loads(body)["sessions"]["active"]
    except (ValueError, KeyError, TypeError):
        return f"/readyz answered {body[:200]!r}"
    return active if isinstance(active, int) else f"/readyz answered {body[:200]!r}"


def _key_refused(url: str, api_key: str | None) -> str | None:
    """Why the server at ``url`` refuses ``api_key`` (``GET /v1/models`` checks it as
    the websocket's handshake does), or None if it takes it."""
    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    request = urllib.request.Request(f"{url}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=_PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as exc:
        if exc.code != 401:
            return None  # not the key: the sessions will say what is wrong
        given = "no API key" if api_key is None else "the API key given"
        return (
            f"the server at {url} refused {given} (401): pass its key with --api-key "
            f"or {API_KEY_ENV}"
        )
    except OSError:
        return None  # it answered /readyz a moment ago: the sessions will say


async def running_server(ws_url: str, api_key: str | None = None) -> ServerProcess:
    """A server already running at ``ws_url`` (``ws://HOST:PORT/v1/realtime``), once its
    ``/readyz`` answers with a session count and it takes ``api_key``.

    Raises:
        ValueError: ``ws_url`` is no ``ws://`` or ``wss://`` URL.
        ServerStartError: nothing answers there as the realtime server does, or it
            refuses the key.
    """
    scheme, sep, rest = ws_url.partition("://")
    if not sep or scheme not in ("ws", "wss") or not rest.split("/", 1)[0]:
        raise ValueError(
            f"--url {ws_url!r}: give the realtime websocket, ws://HOST:PORT/v1/realtime"
        )
    host, _, path = rest.partition("/")
    if path.rstrip("/") != "v1/realtime":
        raise ValueError(f"--url {ws_url!r}: the realtime websocket's path is /v1/realtime")
    url = f"{'https' if scheme == 'wss' else 'http'}://{host}"
    held = await asyncio.to_thread(_sessions_held, url)
    if not isinstance(held, int):
        raise ServerStartError(
            f"no realtime server at {ws_url} ({held}); start one with `omni-actors serve`"
        )
    refused = await asyncio.to_thread(_key_refused, url, api_key)
    if refused is not None:
        raise ServerStartError(refused)
    return ServerProcess(url=url, ws_url=ws_url, pid=None, api_key=api_key)


def _log_tail(path: Path) -> str:
    try:
        text = path.read_bytes()[-_LOG_TAIL:].decode(errors="replace")
    except OSError:
        return "(no log)"
    return text.strip() or "(empty log)"


def _read_ready(path: Path) -> dict[str, Any] | None:
    """The ready file's contents, or None while it is not there (it appears whole)."""
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return info


async def _wait_ready(
    proc: asyncio.subprocess.Process, ready: Path, log: Path, timeout_s: float
) -> ServerProcess:
    """The server once its ready file is there; fails at once if the server exits."""
    exited = asyncio.ensure_future(proc.wait())
    try:
        async with asyncio.timeout(timeout_s):
            while (info := _read_ready(ready)) is None:
                # Waiting for the exit, one poll period at a time: the file has no event.
                done, _ = await asyncio.wait([exited], timeout=_POLL_S)
                if done:
                    raise ServerStartError(
                        f"the bench server exited with code {proc.returncode} before it was "
                        f"ready; its log ends with:\n{_log_tail(log)}"
                    )
    except TimeoutError:
        raise ServerStartError(
            f"the bench server was not ready within {timeout_s:g}s (preparing weights the "
            f"first time takes longer); its log ends with:\n{_log_tail(log)}"
        ) from None
    finally:
        exited.cancel()
    return ServerProcess(url=info["url"], ws_url=info["ws_url"], pid=proc.pid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _stop(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
    """SIGTERM the server, SIGKILL its whole group past ``timeout_s``, then make sure no
    process of the group is left (a worker orphaned by a killed server included)."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    try:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(timeout_s):
                    await proc.wait()
            except TimeoutError:
                log.warning("the bench server did not stop within %gs; killing it", timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        await proc.wait()  # exited or SIGKILLed: reaped at once
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid) and time.monotonic() < deadline:  # noqa: ASYNC110
        # Orphaned workers are not our children: no exit to wait on, so poll.
        await asyncio.sleep(_POLL_S)
    if _group_alive(pgid):
        log.warning("processes of the bench server's group %d outlived SIGKILL", pgid)


@contextlib.asynccontextmanager
async def server_process(
    args: Sequence[str], *, ready_timeout_s: float = 300.0, stop_timeout_s: float = 20.0
) -> AsyncIterator[ServerProcess]:
    """Run ``python -m omni_actors.bench.realtime_server ARGS`` until the block ends.

    The block is entered once the server has written its ready file. Leaving it, by
    any path, stops the server (see the module docstring).

    Args:
        args: the server's arguments (``--ready-file`` is added here).
        ready_timeout_s: how long the server may take to start (weights included).
        stop_timeout_s: how long it may take to drain and stop after SIGTERM.

    Raises:
        ServerStartError: it exited before it was ready, or was not ready in time.
    """
    with tempfile.TemporaryDirectory(prefix="omni-bench-realtime-") as tmp:
        ready, log_path = Path(tmp) / "ready.json", Path(tmp) / "server.log"
        command = [sys.executable, "-m", "omni_actors.bench.realtime_server", *args]
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                "--ready-file",
                str(ready),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            os.close(log_fd)  # the server holds its own copy
        try:
            yield await _wait_ready(proc, ready, log_path, ready_timeout_s)
        finally:
            await _stop(proc, stop_timeout_s)
