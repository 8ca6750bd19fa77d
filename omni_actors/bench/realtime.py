"""``omni-actors bench realtime``: the realtime server under concurrent spoken sessions.

What a deployment is sized by is how many callers a server holds at once and what each
costs: so the bench starts the server (``omni_actors.bench.realtime_server``) in a
process of its own and drives it with N concurrent websocket clients
(:mod:`omni_actors.bench.realtime_client`), each speaking ``turns`` turns of paced
speech-like audio. Per N it reports what a caller feels (TTFA after the end of speech,
RTF, cancel latency, errors; no audio of a response after its ``response.done``) and what
the server spends: its CPU seconds, alone and with its worker processes, per
session-second (the sum over sessions of the time each was connected).

Audio that arrives in bursts sounds broken even when its RTF is low, so each client
also plays every completed response on paper: after a 200 ms jitter buffer, at real
time (``omni_actors.audio.playout``). A level reports those players' underruns (stalls)
per minute of audio, and the longest gap between two audio deltas; the target is none.

Then one session at a time speaks each of ``input_audio_s`` (5 s and 60 s by default):
the server hands appended audio to the pipeline as it arrives, so TTFA after the end
of speech should not grow with the length of the input (target: the longest input's
TTFA at most 1.2 times the shortest's). Lengths are interleaved within each repetition,
so drifting load on a shared machine weighs on them alike; the median is reported.

With ``url`` the bench drives a server already running there (``omni-actors serve``)
instead of starting one: the same figures, but for the server's CPU time, which it can
read only of a process it started (None), and replies as long as that server makes them
(``reply_tokens`` is None).

One server serves the whole run, warmed up by one short turn before the first level;
its CPU time is read around each level only. Each level, and each input-length
session, starts once the server has freed the sessions before it: their clients have
left by then, but the server frees a session after its client's close returns, and a
server full of them would refuse the new ones (``busy``: the server is sized to the
largest level). A client that gives up is counted under ``errors_by_code``, and the
turns it did not speak make ``turns`` fall short of ``turns_expected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from omni_actors.audio.playout import JITTER_BUFFER_S
from omni_actors.bench.input_length import (
    DEFAULT_INPUT_AUDIO_S,
    TTFA_RATIO_LIMIT,
    check_input_lengths,
    length_key,
    synthetic_speech,
)
from omni_actors.bench.pipeline import _machine
from omni_actors.bench.realtime_client import CLIENT_RATE, ClientReport, encode_frames, run_client
from omni_actors.bench.server_process import (
    CpuSnapshot,
    ServerProcess,
    running_server,
    server_process,
)
from omni_actors.bench.stats import percentile
from omni_actors.bench.steps import Progress, Steps
from omni_actors.pipeline.spec.pipeline import load_pipeline

__all__ = [
    "DEFAULT_INPUT_REPEATS",
    "DEFAULT_SESSIONS",
    "realtime_table",
    "run_realtime_bench",
]

DEFAULT_SESSIONS = (1, 4, 16)
DEFAULT_INPUT_REPEATS = 2
_WARMUP_S = 1.0  # one short turn before measuring: first forwards, allocator, caches


def _clip(seconds: float, seed: int) -> list[str]:
    return encode_frames(synthetic_speech(seconds, seed, CLIENT_RATE))


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not every platform has a load average
        return None


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _p(values: list[float], p: float, digits: int = 1) -> float | None:
    """The ``p``-th percentile of ``values``, rounded; None if there are none."""
    return round(percentile(values, p), digits) if values else None


def _summarise(reports: list[ClientReport], turns: int) -> dict[str, Any]:
    """One level's figures from its clients' reports."""
    done = [t for r in reports for t in r.turns]
    ttfa = [t.ttfa_ms for t in done if t.ttfa_ms is not None]
    rtf = [t.rtf for t in done if t.rtf is not None]
    cancel = [t.cancel_ms for t in done if t.cancel_ms is not None]
    completed = [t for t in done if t.status == "completed"]
    underruns = sum(t.underruns for t in completed)
    played_s = sum(t.audio_s for t in completed)
    gaps = [t.gap_max_ms for t in completed if t.gap_max_ms is not None]
    errors: Counter[str] = Counter()
    for report in reports:
        errors.update(report.errors)
    return {
        "sessions": len(reports),
        "turns": len(done),
        "turns_expected": len(reports) * turns,
        "completed_turns": sum(t.status == "completed" for t in done),
        "ttfa_ms_p50": _p(ttfa, 50),
        "ttfa_ms_p99": _p(ttfa, 99),
        "rtf_p50": _p(rtf, 50, 4),
        "rtf_p99": _p(rtf, 99, 4),
        "audio_s_per_turn_p50": _p([t.audio_s for t in done if t.status == "completed"], 50, 3),
        "cancel_ms_p50": _p(cancel, 50),
        "cancel_ms_p99": _p(cancel, 99),
        "cancel_status": dict(Counter(t.status for t in done if t.cancel_ms is not None)),
        "late_audio_deltas": sum(r.late_audio_deltas for r in reports),
        "underruns": underruns,
        "underruns_per_min": round(underruns * 60.0 / played_s, 3) if played_s else None,
        "stall_ms": round(sum(t.stall_ms for t in completed), 1),
        "audio_gap_max_ms_p50": _p(gaps, 50),
        "audio_gap_max_ms_max": _round(max(gaps, default=None)),
        "errors": sum(errors.values()),
        "errors_by_code": dict(sorted(errors.items())),
        "max_send_lag_ms": _round(max((t.send_lag_ms for t in done), default=None)),
    }


def _server_cpu(
    start: CpuSnapshot | None, end: CpuSnapshot | None, session_s: float, audio_s: float
) -> dict[str, float | None]:
    """The server's CPU seconds over a level, alone and with its workers, per
    session-second, and with its workers per second of audio sent (None where
    ``/proc`` could not tell).

    Per session-second is what a deployment is sized by while the server keeps up;
    once it falls behind real time, sessions last longer and that figure falls, while
    the CPU per second of audio does not."""
    if start is None or end is None:
        own: float | None = None
        with_workers: float | None = None
    else:
        own, with_workers = end.since(start)

    def per(cpu: float | None, seconds: float) -> float | None:
        return None if cpu is None or not seconds else round(cpu / seconds, 4)

    return {
        "cpu_s": _round(own, 2),
        "cpu_s_with_workers": _round(with_workers, 2),
        "session_s": round(session_s, 2),
        "audio_s": round(audio_s, 2),
        "cpu_s_per_session_s": per(own, session_s),
        "cpu_s_per_session_s_with_workers": per(with_workers, session_s),
        "cpu_s_per_audio_s_with_workers": per(with_workers, audio_s),
    }


async def _level(
    server: ServerProcess,
    sessions: int,
    turns: int,
    speech_s: float,
    seed: int,
    timeout_s: float,
) -> dict[str, Any]:
    """``sessions`` concurrent clients, ``turns`` turns each; the last one cancelled."""
    clips = [[_clip(speech_s, seed + 1000 * i + t) for t in range(turns)] for i in range(sessions)]
    await server.wait_idle(timeout_s)
    load_start, cpu_start = _load(), server.cpu()
    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(
                run_client(
                    server.ws_url,
                    frames,
                    cancel_last=True,
                    timeout_s=timeout_s,
                    api_key=server.api_key,
                )
            )
            for frames in clips
        ]
    wall_s = time.perf_counter() - started
    cpu_end = server.cpu()
    reports = [task.result() for task in tasks]
    level = _summarise(reports, turns)
    session_s = sum(r.connected_s for r in reports)
    audio_s = sum(t.audio_s for r in reports for t in r.turns)
    level["server_cpu"] = _server_cpu(cpu_start, cpu_end, session_s, audio_s)
    level["wall_s"] = round(wall_s, 2)
    level["load_1m"] = {"start": load_start, "end": _load()}
    return level


async def _input_length(
    server: ServerProcess,
    lengths: tuple[float, ...],
    repeats: int,
    seed: int,
    timeout_s: float,
    steps: Steps,
) -> dict[str, Any]:
    """TTFA after the end of speech per input length, one session at a time."""
    clips = {length_key(s): _clip(s, seed) for s in lengths}
    ttfa: dict[str, list[float]] = {key: [] for key in clips}
    errors: dict[str, Counter[str]] = {key: Counter() for key in clips}
    load_start = _load()
    for repeat in range(1, repeats + 1):
        for key, frames in clips.items():
            steps.start(f"input length {key}, session {repeat}/{repeats}")
            await server.wait_idle(timeout_s)
            report = await run_client(
                server.ws_url,
                [frames],
                cancel_last=False,
                timeout_s=timeout_s,
                api_key=server.api_key,
            )
            errors[key].update(report.errors)
            ttfa[key] += [t.ttfa_ms for t in report.turns if t.ttfa_ms is not None]
    per_length: dict[str, dict[str, Any]] = {
        key: {
            "ttfa_ms_median": _round(statistics.median(ttfa[key])) if ttfa[key] else None,
            "ttfa_ms": [round(v, 1) for v in ttfa[key]],
            "errors": sum(errors[key].values()),
            "errors_by_code": dict(sorted(errors[key].items())),
        }
        for key in clips
    }
    low = per_length[length_key(min(lengths))]["ttfa_ms_median"]
    high = per_length[length_key(max(lengths))]["ttfa_ms_median"]
    ratio = round(high / low, 3) if len(lengths) > 1 and low and high is not None else None
    return {
        "lengths": per_length,
        "ttfa_ratio": ratio,
        "load_1m": {"start": load_start, "end": _load()},
        "repeats": repeats,
    }


def _targets(
    levels: dict[str, dict[str, Any]], input_length: dict[str, Any] | None
) -> dict[str, Any]:
    top = max(levels, key=int)
    errors = levels[top]["errors"]
    late = sum(level["late_audio_deltas"] for level in levels.values())
    targets: dict[str, Any] = {
        "zero_errors": {"sessions": int(top), "measured": errors, "met": errors == 0},
        "no_audio_after_response_done": {"measured": late, "met": late == 0},
        "no_underruns": {
            "sessions": int(top),
            "measured": levels[top]["underruns"],
            "met": levels[top]["underruns"] == 0,
        },
    }
    if input_length is not None:
        ratio = input_length["ttfa_ratio"]
        targets["input_length_ttfa_ratio"] = {
            "limit": TTFA_RATIO_LIMIT,
            "measured": ratio,
            "met": None if ratio is None else ratio <= TTFA_RATIO_LIMIT,
        }
    return targets


def _check(
    sessions: Sequence[int], turns: int, speech_s: float, input_repeats: int, timeout_s: float
) -> None:
    if not sessions or min(sessions) < 1:
        raise ValueError(f"session counts must be >= 1, got {list(sessions)}")
    if len(set(sessions)) != len(sessions):
        raise ValueError(f"session counts must be distinct, got {list(sessions)}")
    if turns < 1:
        raise ValueError(f"turns must be >= 1, got {turns}")
    check_input_lengths([speech_s])
    if input_repeats < 1:
        raise ValueError(f"input repeats must be >= 1, got {input_repeats}")
    if not timeout_s > 0:
        raise ValueError(f"the timeout must be > 0 s, got {timeout_s}")


async def run_realtime_bench(
    preset: str | Path = "tiny-omni",
    sessions: Sequence[int] = DEFAULT_SESSIONS,
    *,
    turns: int = 3,
    speech_s: float = 3.0,
    input_audio_s: Sequence[float] = DEFAULT_INPUT_AUDIO_S,
    input_repeats: int = DEFAULT_INPUT_REPEATS,
    cache_dir: Path | None = None,
    seed: int = 0,
    reply_tokens: int = 48,
    timeout_s: float = 120.0,
    ready_timeout_s: float = 300.0,
    progress: Progress | None = None,
    url: str | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Measure the realtime server on ``preset`` (see the module docstring).

    Args:
        preset: a preset name or YAML path whose entry stage takes audio.
        sessions: concurrent sessions, one level each, in this order.
        turns: spoken turns per session; the last one's response is cancelled.
        speech_s: seconds of speech per turn (a whole number of 20 ms frames).
        input_audio_s: input lengths of the TTFA-vs-input-length figure (empty: none).
        input_repeats: sessions per input length; the median is reported.
        cache_dir: the weights cache (prepared by the server if missing).
        seed: the weights' and the synthetic speech's seed.
        reply_tokens: text tokens per reply (the server fixes every reply's length).
        timeout_s: each client step's deadline (a response from commit to done).
        ready_timeout_s: how long the server may take to start.
        progress: told as each step starts (the server, the warm-up turn, each level,
            each input-length session; see :mod:`~omni_actors.bench.steps`).
        url: a running server's realtime websocket (``ws://HOST:PORT/v1/realtime``) to
            drive instead of starting one on ``preset`` (then ``preset``, ``cache_dir``
            and ``reply_tokens`` are not used; ``seed`` seeds the speech only).
        api_key: the key of the server at ``url``, sent by every client as
            ``Authorization: Bearer`` (a server started here takes none).

    Returns:
        ``levels`` (per session count: TTFA p50/p99 after the end of speech, RTF,
        cancel latency and statuses, late audio deltas, underruns per minute of audio
        after a 200 ms jitter buffer and the longest delta gaps, errors by code, the server's
        CPU per session-second, wall time, load), ``input_length`` (per length: TTFA
        median, and the longest/shortest ratio; absent without lengths), ``targets``,
        ``warmup_errors_by_code`` (the unmeasured first turn's), ``machine``,
        ``parameters`` and ``wall_s``.

    Raises:
        ValueError: a bad count or length (before anything starts).
        PipelineConfigError: ``preset`` cannot be loaded.
        ServerStartError: the server did not start, none answers at ``url``, or it
            refuses ``api_key``.
        ServerBusyError: the server did not free a step's sessions within ``timeout_s``.
    """
    _check(sessions, turns, speech_s, input_repeats, timeout_s)
    lengths = tuple(sorted(check_input_lengths(input_audio_s))) if input_audio_s else ()
    if url is None:
        load_pipeline(preset)  # a bad preset fails here, not in the server's log
    started = time.perf_counter()
    steps = Steps(progress, 2 + len(sessions) + len(lengths) * input_repeats)
    steps.start(f"starting the server on {preset}" if url is None else f"connecting to {url}")
    async with _server(
        url, api_key, preset, sessions, cache_dir, seed, reply_tokens, ready_timeout_s
    ) as server:
        steps.start("warm-up turn")
        warmup = await run_client(
            server.ws_url,
            [_clip(_WARMUP_S, seed + 1)],
            cancel_last=False,
            timeout_s=timeout_s,
            api_key=server.api_key,
        )
        levels: dict[str, dict[str, Any]] = {}
        for n in sessions:
            steps.start(f"{n} sessions x {turns} turns")
            levels[str(n)] = await _level(server, n, turns, speech_s, seed, timeout_s)
        input_length = (
            await _input_length(server, lengths, input_repeats, seed, timeout_s, steps)
            if lengths
            else None
        )
    report: dict[str, Any] = {
        "levels": levels,
        "warmup_errors_by_code": dict(sorted(warmup.errors.items())),
    }
    if input_length is not None:
        report["input_length"] = input_length
    return report | {
        "targets": _targets(levels, input_length),
        "machine": _machine(),
        "parameters": {
            "preset": str(preset) if url is None else None,
            "url": url,
            "api_key": api_key is not None,  # whether one was sent, never the key
            "sessions": list(sessions),
            "turns": turns,
            "speech_s": speech_s,
            "frame_ms": 20,
            "sample_rate": CLIENT_RATE,
            "jitter_buffer_ms": JITTER_BUFFER_S * 1e3,
            "input_audio_s": list(lengths),
            "input_repeats": input_repeats,
            "reply_tokens": reply_tokens if url is None else None,
            "seed": seed,
            "warmup_s": _WARMUP_S,
            "timeout_s": timeout_s,
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }


@contextlib.asynccontextmanager
async def _server(
    url: str | None,
    api_key: str | None,
    preset: str | Path,
    sessions: Sequence[int],
    cache_dir: Path | None,
    seed: int,
    reply_tokens: int,
    ready_timeout_s: float,
) -> AsyncIterator[ServerProcess]:
    """The server at ``url``, or one started on ``preset``, sized to the largest level
    and stopped when the block ends."""
    if url is not None:
        yield await running_server(url, api_key)
        return
    args = ["--preset", str(preset), "--port", "0", "--seed", str(seed)]
    args += ["--reply-tokens", str(reply_tokens), "--max-sessions", str(max(sessions))]
    if cache_dir is not None:
        args += ["--cache-dir", str(cache_dir)]
    async with server_process(args, ready_timeout_s=ready_timeout_s) as server:
        yield server


def realtime_table(result: dict[str, Any]) -> list[str]:
    """The run as a few lines of text: one row per session count, a line for each level
    whose clients gave turns up (and why), then the input-length figure and the
    targets."""
    rows = [
        "realtime sessions (TTFA and cancel in ms after the end of speech / the cancel; "
        "CPU in server seconds per session-second)",
        f"{'sessions':>8} {'ttfa_p50':>9} {'ttfa_p99':>9} {'rtf_p50':>8} {'cancel_p50':>10} "
        f"{'cancel_p99':>10} {'errors':>6} {'late':>5} {'underr/min':>10} {'gap_max':>8} "
        f"{'cpu/s':>7} {'+workers':>8}",
    ]

    def cell(value: Any, width: int, fmt: str = ".1f") -> str:
        return f"{'-' if value is None else format(value, fmt):>{width}}"

    for n, level in result["levels"].items():
        cpu = level["server_cpu"]
        rows.append(
            f"{n:>8} {cell(level['ttfa_ms_p50'], 9)} {cell(level['ttfa_ms_p99'], 9)} "
            f"{cell(level['rtf_p50'], 8, '.3f')} {cell(level['cancel_ms_p50'], 10)} "
            f"{cell(level['cancel_ms_p99'], 10)} {level['errors']:>6} "
            f"{level['late_audio_deltas']:>5} {cell(level['underruns_per_min'], 10, '.2f')} "
            f"{cell(level['audio_gap_max_ms_max'], 8)} "
            f"{cell(cpu['cpu_s_per_session_s'], 7, '.3f')} "
            f"{cell(cpu['cpu_s_per_session_s_with_workers'], 8, '.3f')}"
        )
    for n, level in result["levels"].items():
        # A client that gave up took its unspoken turns with it: say so, with why.
        if missing := level["turns_expected"] - level["turns"]:
            why = ", ".join(f"{code} x{count}" for code, count in level["errors_by_code"].items())
            rows.append(
                f"{n} sessions: {missing} of {level['turns_expected']} turns not spoken "
                f"({why or 'no error recorded'})"
            )
    section = result.get("input_length")
    if section is not None:
        rows.append(
            f"TTFA after the end of speech by input length (median of {section['repeats']})"
        )
        for key, entry in section["lengths"].items():
            rows.append(
                f"{key:>8} s {cell(entry['ttfa_ms_median'], 9)} ms, errors {entry['errors']}"
            )
        if section["ttfa_ratio"] is not None:
            keys = list(section["lengths"])
            rows.append(
                f"TTFA {keys[-1]} s / {keys[0]} s: {section['ttfa_ratio']:.2f} "
                f"(target <= {TTFA_RATIO_LIMIT:g})"
            )
    for name, target in result["targets"].items():
        rows.append(f"target {name}: measured {target['measured']}, met {target['met']}")
    return rows
