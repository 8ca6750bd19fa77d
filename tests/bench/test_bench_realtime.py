"""``omni-actors bench realtime``: its report, its client's bookkeeping, its server process.

The bench is run for real on the ``scripted-omni`` preset at tiny sizes (its shape, and
that its numbers were measured, never how large they are); the client's reading of a
response (TTFA, cancel, late audio, failures) against a scripted websocket stand-in;
the server process's stop paths, and the CPU arithmetic, on their own. Benchmarks are
never timed assertions: nothing here bounds a latency.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import torch
import websockets

from omni_actors.bench import realtime, realtime_client
from omni_actors.bench.realtime import realtime_table
from omni_actors.bench.realtime_client import (
    ClientReport,
    _Connection,
    _turn,
    encode_frames,
)
from omni_actors.bench.server_process import (
    CpuSnapshot,
    ServerBusyError,
    ServerProcess,
    ServerStartError,
    cpu_snapshot,
    server_process,
)
from omni_actors.bench.steps import Steps
from omni_actors.cli import main
from omni_actors.protocols.realtime_client import InputAudioBufferClear
from omni_actors.testing import eventually

SERVER_MODULE = "omni_actors.bench.realtime_server"
KEY = "bench-key"


_RUN = "OMNI_ACTORS_TEST_RUN"


def _server_pids(run: str) -> set[int]:
    """Every process running the bench's server module that this test started: its
    environment carries the test's own mark (a server runs in a session of its own, and
    other test runs on the machine start servers of theirs)."""
    found = set()
    mark = f"{_RUN}={run}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if SERVER_MODULE.encode() not in f.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.add(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture
def no_server_left(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    run = uuid.uuid4().hex
    monkeypatch.setenv(_RUN, run)
    yield
    assert _server_pids(run) == set(), "a bench server outlived its bench"


def test_the_json_report_of_two_sessions_on_scripted_omni(
    capsys: pytest.CaptureFixture[str], no_server_left: None
) -> None:
    argv = ["bench", "realtime", "--preset", "scripted-omni", "--sessions", "2"]
    argv += ["--turns", "2", "--speech-s", "0.2", "--input-audio-s", "0.2", "0.4"]
    argv += ["--input-repeats", "1", "--json"]

    assert main(argv) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)

    assert set(result) == {
        "levels",
        "warmup_errors_by_code",
        "input_length",
        "targets",
        "machine",
        "parameters",
        "wall_s",
    }
    level = result["levels"]["2"]
    assert level["sessions"] == 2
    assert level["turns"] == level["turns_expected"] == 4, level["errors_by_code"]
    assert level["completed_turns"] == 2  # the first turn of each; the last is cancelled
    assert level["errors"] == 0, level["errors_by_code"]
    assert level["late_audio_deltas"] == 0
    assert level["cancel_status"] == {"cancelled": 2}
    assert 0 < level["ttfa_ms_p50"] <= level["ttfa_ms_p99"]
    assert 0 < level["cancel_ms_p50"] <= level["cancel_ms_p99"]
    assert level["rtf_p50"] > 0
    assert level["audio_s_per_turn_p50"] > 0
    cpu = level["server_cpu"]
    assert cpu["session_s"] > 0
    assert 0 < cpu["cpu_s"] <= cpu["cpu_s_with_workers"]
    per_session_s = cpu["cpu_s"] / cpu["session_s"]  # of rounded figures
    assert cpu["cpu_s_per_session_s"] == pytest.approx(per_session_s, rel=0.05, abs=0.01)
    assert cpu["audio_s"] > 0
    assert cpu["cpu_s_per_audio_s_with_workers"] > 0
    lengths = result["input_length"]["lengths"]
    assert list(lengths) == ["0.2", "0.4"]
    for entry in lengths.values():
        assert entry["errors"] == 0
        assert len(entry["ttfa_ms"]) == 1
        assert entry["ttfa_ms_median"] > 0
    assert result["input_length"]["ttfa_ratio"] > 0
    assert result["targets"]["zero_errors"] == {"sessions": 2, "measured": 0, "met": True}
    assert result["targets"]["no_audio_after_response_done"]["met"] is True
    # Each completed turn was played on paper after a 200 ms jitter buffer.
    assert isinstance(level["underruns"], int)
    assert level["underruns_per_min"] >= 0
    assert level["stall_ms"] >= 0
    assert level["audio_gap_max_ms_p50"] <= level["audio_gap_max_ms_max"]
    no_underruns = result["targets"]["no_underruns"]
    assert no_underruns["sessions"] == 2
    assert no_underruns["met"] is (level["underruns"] == 0)
    assert result["parameters"]["jitter_buffer_ms"] == 200
    assert result["parameters"]["sessions"] == [2]
    assert result["warmup_errors_by_code"] == {}


def _shape(value: Any) -> Any:
    """A report's keys, nested, with every figure reduced to whether it is there."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    return value is not None


async def test_bench_realtime_url_reports_the_figures_of_a_running_server(
    capsys: pytest.CaptureFixture[str], no_server_left: None
) -> None:
    options = ["--sessions", "2", "--turns", "2", "--speech-s", "0.2"]
    options += ["--input-audio-s", "0.2", "0.4", "--input-repeats", "1", "--json"]
    own_argv = ["bench", "realtime", "--preset", "scripted-omni", *options]
    assert await asyncio.to_thread(main, own_argv) == 0
    own: dict[str, Any] = json.loads(capsys.readouterr().out)

    args = ["--preset", "scripted-omni", "--port", "0", "--max-sessions", "2"]
    async with server_process([*args, "--api-key", KEY]) as server:
        url_argv = ["bench", "realtime", "--url", server.ws_url, "--api-key", KEY, *options]
        assert await asyncio.to_thread(main, url_argv) == 0
    driven: dict[str, Any] = json.loads(capsys.readouterr().out)

    level = driven["levels"]["2"]
    assert level["turns"] == level["turns_expected"] == 4, level["errors_by_code"]
    assert level["errors"] == 0, level["errors_by_code"]
    assert level["cancel_status"] == {"cancelled": 2}
    assert 0 < level["ttfa_ms_p50"] <= level["ttfa_ms_p99"]
    assert level["rtf_p50"] > 0
    assert driven["targets"]["zero_errors"]["met"] is True
    assert driven["parameters"]["url"] == server.ws_url
    assert driven["parameters"]["api_key"] is True  # that one was sent, never the key
    assert KEY not in json.dumps(driven)
    # The same figures as a run on a server of its own, but for what only a process the
    # bench started can tell: its CPU time, and the reply length it fixed.
    cpu = level["server_cpu"]
    assert cpu["cpu_s"] is None
    assert cpu["cpu_s_per_session_s"] is None
    assert cpu["session_s"] > 0
    expected = _shape(own)
    for key in ("cpu_s", "cpu_s_with_workers", "cpu_s_per_session_s"):
        expected["levels"]["2"]["server_cpu"][key] = False
    expected["levels"]["2"]["server_cpu"]["cpu_s_per_session_s_with_workers"] = False
    expected["levels"]["2"]["server_cpu"]["cpu_s_per_audio_s_with_workers"] = False
    expected["parameters"] |= {"preset": False, "url": True, "reply_tokens": False}
    assert _shape(driven) == expected
    assert own["parameters"]["url"] is None
    assert own["parameters"]["api_key"] is False


async def test_bench_realtime_url_says_when_the_server_refuses_its_key(
    monkeypatch: pytest.MonkeyPatch, no_server_left: None
) -> None:
    args = ["--preset", "scripted-omni", "--port", "0", "--api-key", KEY]
    async with server_process(args) as server:
        argv = ["bench", "realtime", "--url", server.ws_url, "--sessions", "1"]
        monkeypatch.delenv("OMNI_ACTORS_API_KEY", raising=False)
        with pytest.raises(SystemExit, match=r"refused no API key \(401\).*OMNI_ACTORS_API_KEY"):
            await asyncio.to_thread(main, argv)
        # The key comes from the environment when --api-key is not given.
        monkeypatch.setenv("OMNI_ACTORS_API_KEY", "not-" + KEY)
        with pytest.raises(SystemExit, match=r"refused the API key given \(401\)"):
            await asyncio.to_thread(main, argv)
    with pytest.raises(SystemExit, match="--api-key is for a --url server"):
        main(["bench", "realtime", "--preset", "scripted-omni", "--api-key", KEY])


def test_bench_realtime_url_without_a_server_says_so(no_server_left: None) -> None:
    with pytest.raises(
        SystemExit, match=re.escape("no realtime server at ws://127.0.0.1:9/v1/realtime")
    ):
        main(["bench", "realtime", "--url", "ws://127.0.0.1:9/v1/realtime", "--sessions", "1"])
    with pytest.raises(SystemExit, match="ws://HOST:PORT/v1/realtime"):
        main(["bench", "realtime", "--url", "http://127.0.0.1:9/", "--sessions", "1"])


async def _session_created(ws: websockets.ClientConnection) -> None:
    event = json.loads(await ws.recv())
    assert event["type"] == "session.created", event


_Step = Callable[[ServerProcess], Awaitable[dict[str, Any]]]


async def _a_level(server: ServerProcess) -> dict[str, Any]:
    """A level of 2 sessions x 2 turns: all 4 spoken, none refused."""
    level = await realtime._level(server, 2, 2, 0.2, seed=0, timeout_s=30.0)
    assert level["turns"] == level["turns_expected"] == 4, level["errors_by_code"]
    return level


async def _an_input_length_session(server: ServerProcess) -> dict[str, Any]:
    """One input-length session: its turn spoken, not refused."""
    section = await realtime._input_length(server, (0.2,), 1, 0, 30.0, Steps(None, 1))
    entry = section["lengths"]["0.2"]
    assert len(entry["ttfa_ms"]) == 1, entry["errors_by_code"]
    return entry


@pytest.mark.parametrize(
    ("step", "slots"), [(_a_level, 2), (_an_input_length_session, 1)], ids=["level", "input"]
)
async def test_a_step_opens_its_sessions_once_the_server_has_freed_those_before_it(
    step: _Step, slots: int, monkeypatch: pytest.MonkeyPatch, no_server_left: None
) -> None:
    # The server frees a session after its client's close has returned, and it is
    # sized to the step (--max-sessions): a step that connected at once found it full
    # and lost the refused client's turns (``busy``). A session the test holds stands
    # for the last step's, not freed yet.
    connected: list[str] = []
    waiting = asyncio.Event()
    run_client, wait_idle = realtime.run_client, ServerProcess.wait_idle

    async def recorded_run_client(ws_url: str, *args: Any, **kwargs: Any) -> ClientReport:
        connected.append(ws_url)
        return await run_client(ws_url, *args, **kwargs)

    async def recorded_wait_idle(server: ServerProcess, timeout_s: float) -> None:
        waiting.set()
        await wait_idle(server, timeout_s)

    monkeypatch.setattr(realtime, "run_client", recorded_run_client)
    monkeypatch.setattr(ServerProcess, "wait_idle", recorded_wait_idle)
    args = ["--preset", "scripted-omni", "--port", "0", "--max-sessions", str(slots)]
    async with server_process(args) as server:
        async with websockets.connect(server.ws_url) as earlier:
            await _session_created(earlier)
            task = asyncio.create_task(step(server))
            try:
                await eventually(lambda: waiting.is_set() or connected, what="the step began")
                assert not connected, "a client connected while the server held a session"
            except BaseException:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise
        result = await task  # the earlier session is freed: the step goes on
    assert result["errors"] == 0, result["errors_by_code"]


async def test_waiting_for_an_idle_server_gives_up_on_a_session_that_stays(
    no_server_left: None,
) -> None:
    args = ["--preset", "scripted-omni", "--port", "0", "--max-sessions", "2"]
    async with server_process(args) as server:
        await server.wait_idle(30.0)  # none yet
        async with websockets.connect(server.ws_url) as held:
            await _session_created(held)
            with pytest.raises(ServerBusyError, match=r"0.2s after their clients left \(1 held\)"):
                await server.wait_idle(0.2)
        await server.wait_idle(30.0)  # freed once its client left


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (["--sessions", "0"], "must be >= 1"),
        (["--turns", "0"], "must be >= 1"),
        (["--speech-s", "0.03"], "0.03s is not a positive whole number"),
        (["--input-audio-s", "5", "--no-input-length"], "not allowed with argument"),
    ],
)
def test_bad_options_are_usage_errors_that_say_why(
    options: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "realtime", *options])

    assert info.value.code == 2
    assert reason in capsys.readouterr().err


def test_an_unknown_preset_fails_before_a_server_starts(no_server_left: None) -> None:
    with pytest.raises(SystemExit, match="no preset named 'nope'"):
        main(["bench", "realtime", "--preset", "nope", "--no-input-length"])


# -- the client's reading of a response ------------------------------------------------

_DELTA = base64.b64encode(bytes(960)).decode()  # 20 ms of PCM16 at 24 kHz


class ScriptedSocket:
    """A websocket stand-in with a scripted server behind it.

    ``response.create`` gets ``response.created`` and ``deltas`` audio deltas, then
    ``response.done`` (``status``) unless ``wait_for_cancel``; ``response.cancel`` gets
    ``response.done`` cancelled, followed by ``late`` more audio deltas of the same
    response (a server that breaks the ordering); ``input_audio_buffer.clear`` gets
    ``input_audio_buffer.cleared``.
    """

    def __init__(
        self,
        *,
        deltas: int = 3,
        status: str = "completed",
        wait_for_cancel: bool = False,
        late: int = 0,
    ) -> None:
        self.deltas, self.status, self.wait_for_cancel, self.late = (
            deltas,
            status,
            wait_for_cancel,
            late,
        )
        self.received: list[str] = []
        self._out: asyncio.Queue[str] = asyncio.Queue()

    def _push(self, **event: Any) -> None:
        self._out.put_nowait(json.dumps(event))

    def _done(self, status: str) -> None:
        details: dict[str, Any] = {"type": status}
        if status == "failed":
            details["error"] = {"type": "server_error", "code": "stage_crashed"}
        self._push(
            type="response.done",
            response={"id": "resp_1", "status": status, "status_details": details},
        )

    async def send(self, text: str) -> None:
        kind = json.loads(text)["type"]
        self.received.append(kind)
        if kind == "response.create":
            self._push(type="response.created", response={"id": "resp_1", "status": "in_progress"})
            for _ in range(self.deltas):
                self._push(type="response.output_audio.delta", response_id="resp_1", delta=_DELTA)
            if not self.wait_for_cancel:
                self._done(self.status)
        elif kind == "response.cancel":
            self._done("cancelled")
            for _ in range(self.late):
                self._push(type="response.output_audio.delta", response_id="resp_1", delta=_DELTA)
        elif kind == "input_audio_buffer.clear":
            self._push(type="input_audio_buffer.cleared")

    async def recv(self) -> str:
        return await self._out.get()


async def _speak(socket: ScriptedSocket, *, cancel: bool) -> tuple[Any, ClientReport]:
    report = ClientReport()
    conn = _Connection(socket, report)  # type: ignore[arg-type]
    frames = encode_frames(torch.zeros(960))  # two 20 ms frames
    turn = await _turn(conn, frames, cancel=cancel, timeout_s=10)
    await conn.send(InputAudioBufferClear())
    await conn.until("input_audio_buffer.cleared", asyncio.get_running_loop().time() + 10)
    return turn, report


async def test_a_completed_turn_reports_its_ttfa_audio_and_rtf() -> None:
    socket = ScriptedSocket(deltas=3)

    turn, report = await _speak(socket, cancel=False)

    assert turn.status == "completed"
    assert turn.ttfa_ms is not None
    assert turn.ttfa_ms >= 0
    assert turn.audio_s == pytest.approx(0.06)  # 3 deltas of 20 ms
    assert turn.rtf is not None
    assert turn.rtf > 0
    assert turn.cancel_ms is None
    assert turn.underruns == 0  # all three came at once: well inside the jitter buffer
    assert turn.gap_max_ms is not None
    assert turn.gap_max_ms >= 0
    assert report.errors == {}
    assert report.late_audio_deltas == 0
    assert socket.received == [
        "input_audio_buffer.append",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "response.create",
        "input_audio_buffer.clear",
    ]


async def test_audio_that_stops_longer_than_the_jitter_buffer_is_an_underrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The client's clock, advanced by the socket: the second delta comes 0.5 s after
    # the first, 20 ms of audio later; a player 200 ms ahead runs dry for 0.48 s + the
    # 200 ms it buffers again.
    clock = [100.0]
    socket = ScriptedSocket(deltas=3)
    recv = socket.recv
    deltas = 0

    async def paced_recv() -> str:
        nonlocal deltas
        text = await recv()
        if json.loads(text)["type"] == "response.output_audio.delta":
            deltas += 1
            clock[0] += 0.5 if deltas == 2 else 0.001
        return text

    socket.recv = paced_recv  # type: ignore[method-assign]
    monkeypatch.setattr(realtime_client.time, "perf_counter", lambda: clock[0])

    turn, _ = await _speak(socket, cancel=False)

    assert turn.status == "completed"
    assert turn.underruns == 1
    assert turn.stall_ms == pytest.approx(500 - 20 - 200 + 200, abs=0.01)
    assert turn.gap_max_ms == pytest.approx(500)


async def test_a_cancelled_turn_sends_the_cancel_on_the_first_audio_delta() -> None:
    socket = ScriptedSocket(deltas=1, wait_for_cancel=True)

    turn, report = await _speak(socket, cancel=True)

    assert socket.received.count("response.cancel") == 1
    assert turn.status == "cancelled"
    assert turn.cancel_ms is not None
    assert turn.cancel_ms >= 0
    assert turn.rtf is None  # a cancelled reply has no real-time factor
    assert report.late_audio_deltas == 0
    assert report.errors == {}


async def test_audio_of_a_response_after_its_response_done_is_counted_late() -> None:
    socket = ScriptedSocket(deltas=1, wait_for_cancel=True, late=2)

    turn, report = await _speak(socket, cancel=True)

    assert turn.status == "cancelled"
    assert report.late_audio_deltas == 2


async def test_a_failed_response_is_an_error_by_its_code() -> None:
    socket = ScriptedSocket(deltas=0, status="failed")

    turn, report = await _speak(socket, cancel=False)

    assert turn.status == "failed"
    assert turn.ttfa_ms is None
    assert turn.rtf is None
    assert report.errors == {"response_failed.stage_crashed": 1}


def test_frames_are_20_ms_pcm16_appends() -> None:
    frames = encode_frames(torch.full((1200,), 0.5))  # 50 ms at 24 kHz: 20 + 20 + 10

    events = [json.loads(f) for f in frames]
    assert [e["type"] for e in events] == ["input_audio_buffer.append"] * 3
    sizes = [len(base64.b64decode(e["audio"])) for e in events]
    assert sizes == [960, 960, 480]
    first = base64.b64decode(events[0]["audio"])
    assert int.from_bytes(first[:2], "little", signed=True) == round(0.5 * 32767)


# -- the server process ------------------------------------------------------------------


def test_cpu_since_counts_new_workers_from_zero_and_ended_ones_through_the_server() -> None:
    earlier = CpuSnapshot(own=10.0, reaped=1.0, workers={101: 4.0, 102: 2.0})
    # 101 went on (+3 s), 102 ended and was reaped (its whole 2.5 s moved to reaped),
    # 103 started (1.5 s); the server itself spent 2 s.
    later = CpuSnapshot(own=12.0, reaped=3.5, workers={101: 7.0, 103: 1.5})

    own, with_workers = later.since(earlier)

    assert own == pytest.approx(2.0)
    assert with_workers == pytest.approx(2.0 + 3.0 + 0.5 + 1.5)


def test_cpu_snapshot_reads_this_process_and_nothing_for_a_missing_one() -> None:
    before = cpu_snapshot(os.getpid())
    assert before is not None
    total = sum(i * i for i in range(2_000_000))  # spend some CPU
    after = cpu_snapshot(os.getpid())
    assert after is not None
    assert total > 0

    own, _ = after.since(before)
    assert own > 0
    assert cpu_snapshot(2**22 + 12345) is None  # above the kernel's pid range


async def test_a_server_that_ignores_sigterm_is_killed_with_its_group(
    no_server_left: None,
) -> None:
    args = ["--preset", "scripted-omni", "--port", "0"]
    pids: list[int] = []

    async def bench() -> None:
        async with server_process(args, stop_timeout_s=1.0) as server:
            assert server.pid is not None
            os.kill(server.pid, signal.SIGSTOP)  # a stopped process cannot drain
            pids.append(server.pid)
            raise RuntimeError("the bench failed")

    with pytest.raises(RuntimeError, match="the bench failed"):
        await bench()
    (pid,) = pids

    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


async def test_a_server_that_exits_before_it_is_ready_is_reported_with_its_log(
    no_server_left: None,
) -> None:
    async def bench() -> None:
        async with server_process(["--max-sessions", "many"]):
            pytest.fail("the block must not run")

    with pytest.raises(ServerStartError, match=r"exited with code 2(.|\n)*--max-sessions"):
        await bench()


def test_the_table_shows_each_level_the_input_lengths_and_the_targets() -> None:
    cpu = {"cpu_s_per_session_s": 0.25, "cpu_s_per_session_s_with_workers": 0.5}
    level = {
        "ttfa_ms_p50": 120.0,
        "ttfa_ms_p99": 180.5,
        "rtf_p50": None,  # every turn cancelled
        "cancel_ms_p50": 11.0,
        "cancel_ms_p99": 12.0,
        "errors": 0,
        "late_audio_deltas": 0,
        "underruns_per_min": 0.0,
        "audio_gap_max_ms_max": 85.0,
        "server_cpu": cpu,
        "turns": 3,
        "turns_expected": 3,
        "errors_by_code": {},
    }
    # At 16 sessions, one client was refused: its 3 turns were never spoken.
    refused = {"busy": 1, "client.connection_closed": 1, "response_cancel_not_active": 1}
    result = {
        "levels": {
            "1": level,
            "16": level
            | {"errors": 3, "turns": 45, "turns_expected": 48, "errors_by_code": refused},
        },
        "input_length": {
            "repeats": 2,
            "lengths": {
                "5": {"ttfa_ms_median": 100.0, "errors": 0},
                "60": {"ttfa_ms_median": 110.0, "errors": 0},
            },
            "ttfa_ratio": 1.1,
        },
        "targets": {"zero_errors": {"sessions": 16, "measured": 3, "met": False}},
    }

    rows = realtime_table(result)

    assert rows[2].split() == [
        "1",
        "120.0",
        "180.5",
        "-",
        "11.0",
        "12.0",
        "0",
        "0",
        "0.00",
        "85.0",
        "0.250",
        "0.500",
    ]
    assert rows[3].split()[:7] == ["16", "120.0", "180.5", "-", "11.0", "12.0", "3"]
    assert rows[4] == (
        "16 sessions: 3 of 48 turns not spoken "
        "(busy x1, client.connection_closed x1, response_cancel_not_active x1)"
    )
    assert not any(row.startswith("1 sessions:") for row in rows)
    assert "TTFA 60 s / 5 s: 1.10 (target <= 1.2)" in rows
    assert rows[-1] == "target zero_errors: measured 3, met False"
