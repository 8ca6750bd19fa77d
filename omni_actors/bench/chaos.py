"""``omni-actors bench chaos``: conversations while stages die, clients leave and chunks
go astray; what each fault cost.

The promise under test: a fault costs at most the turn in flight on the failed stage;
it never costs a conversation, never hangs a caller, never leaks.

``sessions`` clients each hold one conversation after another (text turns, each
answered) for ``seconds``, against the preset with every stage in a worker process.
Meanwhile:

- every ``kill_every_s`` a random stage's worker is SIGKILLed (its supervisor restarts
  it);
- a client leaves in the middle of a reply with probability ``disconnect_p`` (it aborts
  its session, as a closed websocket does);
- with ``chunk_faults``, one chunk in ``drop_every`` on one random edge is lost, and one
  in ``duplicate_every`` on another is delivered twice.

Reported: turns started and how each ended (``completed``, ``cancelled``,
``response_failed:<code>``: the response failed and the conversation went on,
``failed:<code>``: the pipeline ended the conversation, ``disconnected``, ``hung``: no
terminal event within the deadline;
``not_admitted:<code>`` counts sessions refused at open), conversations the pipeline
ended between two turns (``ended_between_turns``),
conversations started and lost (ended by the pipeline rather than by their client;
target 0), hung turns (target 0), the recovery time from each kill to the next turn
started after it that completed (p50, max), and the process tree's counts before and
after (:mod:`omni_actors.bench.resources`; target: equal).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from omni_actors.bench.resources import snapshot
from omni_actors.bench.soak import drive, settled
from omni_actors.bench.stats import percentile
from omni_actors.bench.steps import Progress, Steps
from omni_actors.errors import OmniError
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.events import AudioDelta, ResponseDone, SessionError, TextDelta
from omni_actors.testing.chunk_faults import ChunkFaults, PipelineFaults
from omni_actors.testing.faults import kill_worker

__all__ = ["ChaosConfig", "run_chaos_bench"]

_TURNS = 3
_REPLY_DEADLINE_S = 120.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosConfig:
    """What ``bench chaos`` runs (see the module docstring)."""

    sessions: int = 16
    seconds: float = 120.0
    kill_every_s: float = 10.0
    disconnect_p: float = 0.05
    chunk_faults: bool = True
    drop_every: int = 500
    duplicate_every: int = 300
    seed: int = 0

    def check(self) -> None:
        """Raises ValueError for a count or a time out of range."""
        if self.sessions < 1 or self.seconds <= 0 or self.kill_every_s <= 0:
            raise ValueError("sessions >= 1, seconds > 0 and kill_every_s > 0")
        if not 0 <= self.disconnect_p <= 1:
            raise ValueError(f"disconnect_p must be in [0, 1], got {self.disconnect_p}")
        if self.drop_every < 1 or self.duplicate_every < 1:
            raise ValueError("drop_every and duplicate_every must be >= 1")


@dataclass
class _Tally:
    conversations: int = 0
    lost: int = 0
    turns: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # of turns started
    between: Counter[str] = field(default_factory=Counter)  # ends between turns
    completed: list[tuple[float, float]] = field(default_factory=list)  # (started, ended)


async def _conversation(
    omni: OmniPipeline, n: int, tally: _Tally, rng: random.Random, disconnect_p: float
) -> None:
    """One conversation under fire: ``_TURNS`` turns, each answered, or its end."""
    tally.conversations += 1
    session = omni.session()
    in_turn = False
    try:
        error = await session.open()
        if error is not None:
            tally.outcomes[f"not_admitted:{error.code}"] += 1
            return
        for turn in range(_TURNS):
            await session.send(text=f"conversation {n}, turn {turn}: tell me more")
            started = time.monotonic()
            tally.turns += 1
            in_turn = True
            await session.respond()
            leave = rng.random() < disconnect_p
            async with asyncio.timeout(_REPLY_DEADLINE_S):
                async for event in session.events():
                    if leave and isinstance(event, TextDelta | AudioDelta):
                        await session.abort("the client left")
                        tally.outcomes["disconnected"] += 1
                        return
                    if isinstance(event, ResponseDone):
                        code = (
                            event.status
                            if event.code is None
                            else f"response_{event.status}:{event.code}"
                        )
                        tally.outcomes[code] += 1
                        if event.status == "completed":
                            tally.completed.append((started, time.monotonic()))
                        in_turn = False
                    elif isinstance(event, SessionError):
                        tally.outcomes[f"failed:{event.code}"] += 1
                        tally.lost += 1
                        return
        await session.finish()
        async with asyncio.timeout(_REPLY_DEADLINE_S):
            async for _ in session:
                pass
    except OmniError as exc:  # the pipeline ended the session under a call (before
        # TimeoutError: a deadline of ours, such as backpressure, is one too)
        (tally.outcomes if in_turn else tally.between)[f"failed:{exc.code}"] += 1
        tally.lost += 1
    except TimeoutError:
        (tally.outcomes if in_turn else tally.between)["hung"] += 1
    finally:
        await session.close()


def _in_workers(spec: PipelineSpec) -> PipelineSpec:
    """``spec`` with every stage in a worker process of its own (a kill needs one)."""
    stages = tuple(stage.model_copy(update={"process": True}) for stage in spec.stages)
    return spec.model_copy(update={"stages": stages})


def _tolerant(spec: PipelineSpec, kill_every_s: float) -> PipelineSpec:
    """``spec`` whose restart intensity admits the planned kill rate.

    The kills are the experiment: more restarts than ``max_restarts`` within ``period_s``
    would stop the whole pipeline (the supervisor escalates, as it should in production),
    and the bench would measure that instead of recovery.
    """
    sup = spec.supervision
    needed = math.ceil(sup.period_s / kill_every_s) + 1
    if sup.max_restarts >= needed:
        return spec
    return spec.model_copy(update={"supervision": sup.model_copy(update={"max_restarts": needed})})


def _faults(spec: PipelineSpec, config: ChaosConfig, rng: random.Random) -> PipelineFaults:
    if not config.chunk_faults or not spec.edges:
        return PipelineFaults()
    names = [f"{edge.source}->{edge.to}" for edge in spec.edges]
    dropped, duplicated = rng.choice(names), rng.choice(names)
    edges = {dropped: ChunkFaults(drop_every=config.drop_every)}
    # One edge may draw both faults: the duplicate adds to what it has.
    edges[duplicated] = dataclasses.replace(
        edges.get(duplicated, ChunkFaults()), duplicate_every=config.duplicate_every
    )
    return PipelineFaults(edges=edges)


async def _killer(
    omni: OmniPipeline,
    every_s: float,
    stop_at: float,
    rng: random.Random,
    kills: list[dict[str, Any]],
    steps: Steps,
) -> None:
    """SIGKILL a random stage's worker every ``every_s`` until ``stop_at`` (a restarting
    one is skipped); the clients' last conversations then run without kills."""
    t0 = time.monotonic()
    for k in itertools.count(1):
        at = t0 + k * every_s
        if at >= stop_at:
            return
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        stages = await omni.stages()
        name = rng.choice(sorted(stages))
        try:
            pid = kill_worker(stages[name])
        except ValueError:  # restarting after the last kill
            continue
        kills.append({"at": time.monotonic(), "stage": name, "pid": pid})
        steps.update(
            f"faults: killed {name}'s worker at {time.monotonic() - t0:.0f} of "
            f"{stop_at - t0:.0f} s ({len(kills)} kills)"
        )


def _recovery(kills: list[dict[str, Any]], completed: list[tuple[float, float]]) -> list[float]:
    """Per kill, seconds to the end of the first turn started after it that completed."""
    out = []
    for kill in kills:
        ends = [end for start, end in completed if start >= kill["at"]]
        if ends:
            out.append(round(min(ends) - kill["at"], 3))
    return out


async def run_chaos_bench(
    spec: PipelineSpec, config: ChaosConfig, label: str = "", progress: Progress | None = None
) -> dict[str, Any]:
    """Run the chaos (see the module docstring) and report what it cost.

    ``progress`` is told as each step starts (the pipeline, the warm-up round, the
    faults at each kill, the settling; see :mod:`~omni_actors.bench.steps`).

    Raises:
        ValueError: see :meth:`ChaosConfig.check`.
    """
    from omni_actors.bench.pipeline import _machine

    config.check()
    rng = random.Random(config.seed)
    spec = _tolerant(_in_workers(spec), config.kill_every_s)
    faults = _faults(spec, config, rng)
    started = time.perf_counter()
    tally, kills = _Tally(), list[dict[str, Any]]()
    steps = Steps(progress, 4)
    steps.start(f"starting {label or spec.name}, every stage in a worker")
    async with OmniPipeline(spec, max_sessions=config.sessions, **faults.hooks()) as omni:
        steps.start(f"warm-up: a conversation for each of {config.sessions} clients")
        await drive(omni, config.sessions, conversations=config.sessions)  # first use
        counts_start = await settled(omni, None)
        stop_at = time.monotonic() + config.seconds
        steps.start(
            f"faults: {config.sessions} conversations at once for {config.seconds:g} s, "
            f"a worker killed every {config.kill_every_s:g} s"
        )
        tickets = itertools.count()

        async def client() -> None:
            while time.monotonic() < stop_at:
                await _conversation(omni, next(tickets), tally, rng, config.disconnect_p)

        killer = asyncio.ensure_future(
            _killer(omni, config.kill_every_s, stop_at, rng, kills, steps)
        )
        try:
            await asyncio.gather(*(client() for _ in range(config.sessions)))
        finally:
            killer.cancel()
            await asyncio.gather(killer, return_exceptions=True)
        steps.start("settling: counting what is left")
        counts_end = await settled(omni, counts_start)
        restarts = {name: h.restarts for name, h in (await omni.health()).stages.items()}
    recovery = sorted(_recovery(kills, tally.completed))
    hung = tally.outcomes["hung"] + tally.between["hung"]
    # Fewer is no leak: a restarted worker's links to its peers are made again on use.
    leaked = {k: max(0, counts_end[k] - counts_start[k]) for k in counts_start}
    return {
        "preset": label,
        "parameters": {
            "sessions": config.sessions,
            "seconds": config.seconds,
            "kill_every_s": config.kill_every_s,
            "disconnect_p": config.disconnect_p,
            "chunk_faults": {edge: f.__repr__() for edge, f in faults.edges.items()},
            "seed": config.seed,
            "supervision": spec.supervision.model_dump(),
        },
        "kills": [{"stage": k["stage"], "pid": k["pid"]} for k in kills],
        "restarts": restarts,
        "turns_started": tally.turns,
        "turns": dict(tally.outcomes),
        "ended_between_turns": dict(tally.between),
        "conversations": tally.conversations,
        "conversations_lost": tally.lost,
        "hung": hung,
        "recovery_s_p50": percentile(recovery, 50) if recovery else None,
        "recovery_s_max": recovery[-1] if recovery else None,
        "kills_without_recovery": len(kills) - len(recovery),
        "counts_start": counts_start,
        "counts_end": counts_end,
        "leaked": leaked,
        "met": {
            "hung": hung == 0,
            "conversations_lost": tally.lost == 0,
            "leaked": not any(leaked.values()),
        },
        "machine": _machine(),
        "wall_s": round(time.perf_counter() - started, 1),
        "final_snapshot_rss_mb": round(snapshot().rss_total / 2**20, 1),
    }
