"""``omni-actors bench soak``: conversations without end, and whether anything grows.

``sessions`` clients each hold one conversation after another against one pipeline:
open a session, a few user turns each answered (text turns, and one of spoken input),
then finish and close it. Every ``interval_s`` the run samples the process tree
(:func:`~omni_actors.bench.resources.snapshot`: resident memory of every process, open
file descriptors, ``/dev/shm`` entries, child processes, asyncio tasks) and the
orchestrator's live sessions. After the warm-up it fits a line to each series: a leak
is a slope. The target is resident memory flat: less than 5% growth from the end of
the warm-up to the end of the run (30 minutes, by hand). When the clients stop, the
counts must come back to the start's.

:func:`converse` and :func:`drive` are the clients; the suite's short soak test runs
them for a fixed number of conversations instead of a time.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_actors.bench.resources import Resources, snapshot
from omni_actors.bench.stats import percentile
from omni_actors.bench.steps import Progress, Steps
from omni_actors.errors import OmniError
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.events import ResponseDone, SessionError

__all__ = [
    "TARGET_RSS_GROWTH_PCT",
    "Tally",
    "converse",
    "drive",
    "prepared",
    "run_soak_bench",
    "settled",
]

TARGET_RSS_GROWTH_PCT = 5.0
_TURNS = 3
_REPLY_DEADLINE_S = 120.0  # one response, from respond to ResponseDone
_SETTLE_S = 30.0  # for the counts to come back once the clients stop


@dataclass
class Tally:
    """What the clients did: conversations started, and turns by outcome (``completed``,
    ``cancelled``, or a response's or the session's error code; ``hung``: no terminal
    event within the deadline)."""

    conversations: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


async def converse(omni: OmniPipeline, n: int, tally: Tally) -> None:
    """One conversation (conversation ``n``): ``_TURNS`` answered turns, then its end.

    Each turn's outcome is counted in ``tally``; nothing raises for a failed turn.
    """
    tally.conversations += 1
    outcomes = tally.outcomes
    session = omni.session()
    try:
        error = await session.open()
        if error is not None:
            outcomes[error.code] += 1
            return
        for turn in range(_TURNS):
            if turn == 1:  # spoken input: half a second of quiet noise
                noise = torch.randn(8000, generator=torch.Generator().manual_seed(n)) * 0.01
                await session.send(audio=noise)
            else:
                await session.send(text=f"conversation {n}, turn {turn}: how are you?")
            await session.respond()
            async with asyncio.timeout(_REPLY_DEADLINE_S):
                async for event in session.events():
                    if isinstance(event, ResponseDone):
                        outcomes[event.status if event.code is None else event.code] += 1
                    elif isinstance(event, SessionError):
                        outcomes[event.code] += 1
                        return
        await session.finish()
        async with asyncio.timeout(_REPLY_DEADLINE_S):
            async for _ in session:
                pass
    except TimeoutError:
        outcomes["hung"] += 1
    except OmniError as exc:
        outcomes[exc.code] += 1
    finally:
        await session.close()


async def drive(
    omni: OmniPipeline,
    sessions: int,
    *,
    conversations: int | None = None,
    until: Callable[[], bool] | None = None,
    tally: Tally | None = None,
) -> Tally:
    """``sessions`` clients, each holding one conversation after another, until
    ``conversations`` have been started or ``until()`` is true; what they did (counted
    into ``tally`` as they go, when one is given)."""
    tickets = itertools.count()
    tally = Tally() if tally is None else tally

    async def client() -> None:
        while True:
            n = next(tickets)
            if conversations is not None and n >= conversations:
                return
            if until is not None and until():
                return
            await converse(omni, n, tally)

    await asyncio.gather(*(client() for _ in range(sessions)))
    return tally


def _slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(seconds, value)`` points, per minute."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return round(cov / var * 60, 4)


def _median(samples: list[dict[str, Any]], key: str) -> float:
    """The median of ``key`` (a series, or a pid's RSS) over ``samples``."""
    values = [
        float(s[key]) if key in s else float(s["rss_mb_by_pid"].get(key, 0.0)) for s in samples
    ]
    return percentile(values, 50) if values else 0.0


def _sample(t: float, resources: Resources, live: int, done: int) -> dict[str, Any]:
    return {
        "t_s": round(t, 1),
        "rss_mb": round(resources.rss_total / 2**20, 1),
        "rss_mb_by_pid": {str(p): round(b / 2**20, 1) for p, b in resources.rss.items()},
        "live_sessions": live,
        "conversations": done,
        **resources.counts(),
    }


async def settled(omni: OmniPipeline, start: dict[str, int] | None) -> dict[str, int]:
    """The counts once every stage runs, no session is live and no count is above
    ``start``'s (None: once two readings agree), or as they stand at the deadline."""
    deadline = time.monotonic() + _SETTLE_S
    last: dict[str, int] | None = None
    while True:
        health = await omni.health()
        restarting = any(stage.state != "running" for stage in health.stages.values())
        live = restarting or any((await omni.live_sessions()).values())
        counts = snapshot().counts()
        back = counts == last if start is None else all(counts[k] <= start[k] for k in start)
        if not live and back:
            return counts
        if time.monotonic() > deadline:
            return counts
        last = counts
        await asyncio.sleep(0.2)  # a poll of the process tree: nothing to wait on


async def run_soak_bench(
    spec: PipelineSpec,
    *,
    sessions: int,
    minutes: float,
    interval_s: float = 10.0,
    warmup_minutes: float = 2.0,
    label: str = "",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Hold ``sessions`` conversations at once for ``minutes``, sampling each
    ``interval_s``; see the module docstring. ``progress`` is told as each step starts
    (the pipeline, the warm-up round, the run at each sample, the settling; see
    :mod:`~omni_actors.bench.steps`).

    Returns:
        ``samples``, the slopes per minute after the warm-up (``slope_per_min``),
        ``rss_growth_pct`` (the median of the minute after the warm-up to that of the
        last minute; per process too) against the target (``met``),
        ``outcomes`` (turns by outcome, the warm-up round's included),
        ``counts_start`` (after one conversation per client, settled), ``counts_end``
        (after the run, settled) and ``leaked`` (their difference).

    Raises:
        ValueError: a count or a time below its minimum.
    """
    if sessions < 1 or minutes <= 0 or interval_s <= 0 or warmup_minutes < 0:
        raise ValueError("sessions >= 1, minutes > 0, interval_s > 0, warmup_minutes >= 0")
    from omni_actors.bench.pipeline import _machine

    started = time.perf_counter()
    samples: list[dict[str, Any]] = []
    steps = Steps(progress, 4)
    steps.start(f"starting {label or spec.name}")
    async with OmniPipeline(spec, max_sessions=sessions) as omni:
        # One conversation per client first: what a pipeline sets up at its first use
        # (links, slabs, worker threads) is not a leak. The counts start after it.
        steps.start(f"warm-up: a conversation for each of {sessions} clients")
        warmup = await drive(omni, sessions, conversations=sessions)
        start_counts = await settled(omni, None)
        stop_at = time.monotonic() + minutes * 60
        steps.start(f"{sessions} conversations at once for {minutes:g} min")

        def over() -> bool:
            return time.monotonic() >= stop_at

        tally = Tally()
        clients = asyncio.ensure_future(drive(omni, sessions, until=over, tally=tally))
        t0 = time.monotonic()
        while not clients.done():
            live = len(set().union(*(await omni.live_sessions()).values()))
            samples.append(_sample(time.monotonic() - t0, snapshot(), live, tally.conversations))
            if len(samples) > 1:  # the first is the step's start, reported above
                steps.update(
                    f"{sessions} conversations at once, {(time.monotonic() - t0) / 60:.1f} of "
                    f"{minutes:g} min, {tally.conversations} conversations done"
                )
            await asyncio.wait({clients}, timeout=interval_s)
        await clients
        outcomes = tally.outcomes + warmup.outcomes
        steps.start("settling: counting what is left")
        end_counts = await settled(omni, start_counts)
    after = [s for s in samples if s["t_s"] >= warmup_minutes * 60] or samples[-1:]
    slopes = {
        key: _slope_per_min([(s["t_s"], float(s[key])) for s in after])
        for key in ("rss_mb", "fds", "shm", "children", "tasks", "live_sessions")
    }
    # One sample is a moment: a burst of replies in flight, a collection just done. The
    # RSS "at" the end of the warm-up and at the end is each a minute's median.
    head = [s for s in after if s["t_s"] < after[0]["t_s"] + 60]
    tail = [s for s in after if s["t_s"] > after[-1]["t_s"] - 60]
    first, last = _median(head, "rss_mb"), _median(tail, "rss_mb")
    growth = round((last / first - 1) * 100, 2) if first else math.nan
    by_pid = {
        pid: round((_median(tail, pid) / _median(head, pid) - 1) * 100, 2)
        for pid in after[0]["rss_mb_by_pid"]
        if _median(head, pid) and all(pid in s["rss_mb_by_pid"] for s in tail)
    }
    return {
        "preset": label,
        "sessions": sessions,
        "minutes": minutes,
        "warmup_minutes": warmup_minutes,
        "conversations": tally.conversations,
        "warmup_conversations": warmup.conversations,
        "turns": sum(outcomes.values()),
        "outcomes": dict(outcomes),
        "rss_mb_after_warmup": first,
        "rss_mb_end": last,
        "rss_growth_pct": growth,
        "rss_growth_pct_by_pid": by_pid,
        "target_rss_growth_pct": TARGET_RSS_GROWTH_PCT,
        "met": growth < TARGET_RSS_GROWTH_PCT,
        "slope_per_min": slopes,
        "counts_start": start_counts,
        "counts_end": end_counts,
        "leaked": {k: end_counts[k] - start_counts[k] for k in start_counts},
        "samples": samples,
        "machine": _machine(),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def prepared(preset: str | Path, cache_dir: Path | None, seed: int) -> PipelineSpec:
    """``preset`` with its model families prepared (weights generated once) and named."""
    from omni_actors.models.cache import prepare
    from omni_actors.pipeline.spec.pipeline import load_pipeline

    spec = load_pipeline(preset)
    for family in spec.model_families().values():
        prepare(family, cache_dir=cache_dir, seed=seed)
    return spec.with_weights(cache_dir=cache_dir, seed=seed)
