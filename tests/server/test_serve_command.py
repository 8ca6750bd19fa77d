"""``omni-actors serve`` as a user runs it: a process, SIGTERM, a graceful exit that
leaves no process and nothing in /dev/shm."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from importlib import resources
from pathlib import Path

import pytest
import yaml
from http_client import get
from realtime_client import connect, speech
from websockets.exceptions import ConnectionClosed

from omni_actors.testing import eventually

pytestmark = pytest.mark.integration


def _pipeline_with_workers(tmp_path: Path) -> Path:
    """scripted-omni with its talker and code2wav in worker processes."""
    spec = yaml.safe_load(_preset())
    for stage in spec["stages"][1:]:
        stage["process"] = True
    path = tmp_path / "workers.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _preset() -> str:
    return resources.files("omni_actors").joinpath("presets", "scripted-omni.yaml").read_text()


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.add(int(entry))
                frontier.append(int(entry))
    return found


def _shm_of(pids: set[int]) -> set[str]:
    prefixes = tuple(f"omni-actors-{pid}-" for pid in pids)
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefixes)}


async def test_sigterm_drains_then_exits_cleanly(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "omni_actors.cli", "serve", "--preset",
            str(_pipeline_with_workers(tmp_path)), "--port", "0", "--ready-file", str(ready),
            "--grace-s", "10", stdout=out, stderr=out,
        )  # fmt: skip
    try:
        await eventually(ready.exists, timeout=60, what="the server listens")
        url = ready.read_text().replace("http://", "ws://") + "/v1/realtime"
        workers = _descendants(proc.pid)
        assert len(workers) >= 2, "the talker and code2wav run in worker processes"
        async with connect(url) as client:
            await client.no_vad()
            await client.say(speech(0.2))
            await client.send("response.create")
            await client.until("response.output_audio.delta")
            proc.send_signal(signal.SIGTERM)
            events = await client.until("response.done")
            assert events[-1]["response"]["status"] == "completed"  # it was let finish
            assert (await client.error())["code"] == "server_shutting_down"
            with pytest.raises(ConnectionClosed) as closed:
                await client.recv(timeout=20)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1001
        async with asyncio.timeout(60):
            await proc.wait()
        output = log.read_text()
        assert proc.returncode == 0, output
        assert "draining" in output
        assert not (_descendants(proc.pid) | {p for p in workers if Path(f"/proc/{p}").exists()})
        assert not _shm_of({proc.pid, *workers})
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_served_model_name_sets_the_name_served(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "omni_actors.cli", "serve", "--preset", "scripted-omni",
            "--port", "0", "--ready-file", str(ready), "--served-model-name", "my-omni",
            stdout=out, stderr=out,
        )  # fmt: skip
    try:
        await eventually(ready.exists, timeout=60, what="the server listens")
        url = ready.read_text()
        status, listed = await get(url + "/v1/models")
        assert status == 200, log.read_text()
        assert [m["id"] for m in listed["data"]] == ["my-omni"]
        status, refused = await get(url + "/v1/models/scripted-omni")
        assert (status, refused["error"]["code"]) == (404, "model_not_found")
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            await proc.wait()
