"""``Orchestrator``: the control plane of one pipeline.

It spawns and supervises the stages, admits sessions (one :class:`SessionActor` each,
with the plan of the stages on the request's path), when a stage fails, fails the
sessions that were on it, and reports each stage's health (``Health``): as the stages'
supervisor, it knows which is running or restarting, and how often each has failed. It
never carries a chunk: data flows stage to stage, and from the output stages straight to
each session's actor.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_actors._actor import Actor
from omni_actors._props import Props
from omni_actors._ref import ActorRef
from omni_actors._state import CellState
from omni_actors.actors.engines.transcriber_ports import TRANSCRIBER_OUTPUTS
from omni_actors.actors.stage.actor import StageActor
from omni_actors.errors import OmniError
from omni_actors.pipeline.session_actor import SessionActor
from omni_actors.pipeline.session_channel import SessionChannel
from omni_actors.pipeline.session_path import StagePlan
from omni_actors.pipeline.spec.edge_paths import edge_paths
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.control import (
    Deadlines,
    Health,
    ListSessions,
    ListStages,
    PipelineHealth,
    SessionMessage,
    StageCondition,
    StageFailed,
    StageHealth,
    StageMessage,
    Target,
)
from omni_actors.protocols.message import Request
from omni_actors.protocols.stage import INPUT, Chunk, SessionKey, StepChunks
from omni_actors.signals import ChildFailed, Terminated
from omni_actors.supervision import Backoff, SupervisorStrategy

if TYPE_CHECKING:
    from omni_actors.transport.worker_hosts import WorkerHost

__all__ = [
    "Admitted",
    "Orchestrator",
    "OrchestratorMessage",
    "SessionExistsError",
    "StartSession",
    "pipeline_strategy",
]

log = logging.getLogger(__name__)


class SessionExistsError(OmniError, ValueError):
    """A session id is already in use on this pipeline (the caller should pick another)."""

    code = "admission"


@dataclass(frozen=True, slots=True)
class Admitted:
    """Reply to :class:`StartSession`: the session's actor, its entry stage, its key, and
    its transcriber (the stage its input fans out to; None if not on its path)."""

    session: ActorRef[SessionMessage]
    entry: ActorRef[Chunk]
    key: SessionKey
    transcriber: ActorRef[Chunk] | None = None


@dataclass(frozen=True, slots=True)
class StartSession(Request[Admitted | OmniError]):
    """Caller → orchestrator: admit a session (``omni_actors.protocols.control``, step 1).

    The reply is :class:`Admitted`, or the ``OmniError`` that refused it. It is no
    protocol message because it carries the caller's :class:`SessionChannel`, an object
    of the caller's process: the orchestrator and the session actors always run there,
    and so does this message (and its reply).

    Attributes:
        session: the id (unique among live sessions).
        text: the caller wants text.
        audio: the caller wants audio (text-only requests never touch audio stages).
        resumable: input arrives in segments.
        admission_deadline: system clock time by which prewarm must be done.
        channel: where the session's events go.
        transcript: the caller may ask for transcripts (the transcriber joins the path).
    """

    session: str
    text: bool
    audio: bool
    resumable: bool
    admission_deadline: float
    channel: SessionChannel
    transcript: bool = False


OrchestratorMessage = StartSession | ListSessions | ListStages | Health | Terminated | ChildFailed
"""Every message the orchestrator accepts."""


_CONDITIONS: dict[CellState, StageCondition] = {
    CellState.STARTING: "starting",
    CellState.RUNNING: "running",
    CellState.SUSPENDED: "restarting",
    CellState.STOPPING: "stopped",
    CellState.STOPPED: "stopped",
}


def pipeline_strategy(spec: PipelineSpec) -> SupervisorStrategy:
    """How the orchestrator supervises the stages: one stage restarts alone, within the
    pipeline's restart intensity (``supervision:``); each stage has its restart type."""
    sup = spec.supervision
    return SupervisorStrategy(
        "one_for_one",
        max_restarts=sup.max_restarts,
        period=sup.period_s,
        backoff=Backoff(min_s=sup.backoff_min_s, max_s=sup.backoff_max_s),
        restart_timeout=spec.deadlines.start_s,
    )


class Orchestrator(Actor[OrchestratorMessage]):
    """See the module docstring.

    Args:
        spec: the validated pipeline.
        stage_classes: per stage, the actor class to spawn instead of ``StageActor``
            (the test harness injects faulty stages this way).
        interposers: per edge ``"from->to"`` (``"input-><entry>"`` for the caller's
            input), an actor class spawned locally between the two ends, given the
            downstream ref and the extra arguments (harness chunk faults).
        hosts: per stage actor (a replica's name), the ``WorkerHost`` its worker starts
            on: a cluster's (``omni_actors.pipeline.cluster_hosts``).
    """

    def __init__(
        self,
        spec: PipelineSpec,
        stage_classes: dict[str, type[StageActor]] | None = None,
        interposers: dict[str, tuple[type[Actor[Chunk | StepChunks]], tuple[Any, ...]]]
        | None = None,
        hosts: dict[str, WorkerHost] | None = None,
    ) -> None:
        self.spec = spec
        self.hosts = hosts or {}  # where placed stage actors' workers start, by actor name
        self.paths = edge_paths(spec)
        self.stage_classes = stage_classes or {}
        self.interposers = interposers or {}
        # Replica actors by stage; a replica's actor name is the stage name, suffixed
        # with its index when the stage has several.
        self.replicas: dict[str, list[str]] = {}
        self.stages: dict[str, ActorRef[StageMessage]] = {}  # by actor name
        self.load: dict[str, int] = {}  # live sessions by actor name
        self.restarts: dict[str, int] = {}  # failures of each stage actor (each restarts it)
        self.edge_refs: dict[tuple[str, str], ActorRef[Chunk | StepChunks]] = {}
        # Live sessions by the caller's id: the session actor and the stage actors used.
        self.sessions: dict[str, tuple[ActorRef[SessionMessage], list[str]]] = {}
        self.by_ref: dict[ActorRef[SessionMessage], str] = {}
        self._keys = itertools.count(1)
        deadlines = spec.deadlines
        self.deadlines = Deadlines(
            first_chunk_s=deadlines.first_chunk_s,
            inter_chunk_s=deadlines.inter_chunk_s,
            idle_s=deadlines.idle_s,
            total_s=deadlines.total_s,
        )

    async def on_start(self) -> None:
        """Spawn every stage's replicas (at once: worker processes start in parallel),
        then the harness's interposers."""
        ctx = self.context
        for (source, to), (path, why) in self.paths.items():
            log.info("pipeline %s, edge %s -> %s: %s (%s)", self.spec.name, source, to, path, why)
        spawns: dict[str, asyncio.Task[ActorRef[StageMessage]]] = {}
        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels the other spawns
                for name in self.spec.stages_order():
                    stage = self.spec.stage(name)
                    cls = self.stage_classes.get(name, StageActor)
                    names = stage.replica_names()
                    self.replicas[name] = names
                    for index, actor in enumerate(names):
                        spawns[actor] = group.create_task(
                            ctx.spawn(
                                cls,
                                name,
                                stage.engine.kind,
                                stage.replica_args(index),
                                staging=stage.staging.model_dump(),
                                name=actor,
                                props=Props(
                                    restart=stage.restart,
                                    process=stage.process or actor in self.hosts,
                                    start_timeout=self.spec.deadlines.start_s,
                                    host=self.hosts.get(actor),
                                ),
                            ),
                            name=f"spawn stage {actor}",
                        )
        except BaseExceptionGroup as failed:
            # The caller wants the stage's own error (e.g. bad engine arguments), not a
            # group; the other spawns were cancelled and their stages are stopped.
            for extra in failed.exceptions[1:]:
                log.error("another stage failed to start as well: %r", extra)
            raise failed.exceptions[0] from None
        for actor, spawned in spawns.items():
            self.stages[actor] = spawned.result()
            self.load[actor] = 0
            self.restarts[actor] = 0
        edges = [(e.source, e.to) for e in self.spec.edges]
        inputs = [(INPUT, self.spec.entry_stage)]
        if self.spec.side_transcriber is not None:
            inputs.append((INPUT, self.spec.side_transcriber))
        for source, to in [*inputs, *edges]:
            key = f"{source}->{to}"
            if key in self.interposers:
                if len(self.replicas[to]) > 1:
                    raise ValueError(f"edge faults on {key} need a single replica of {to}")
                cls_, args = self.interposers[key]
                self.edge_refs[(source, to)] = await ctx.spawn(
                    cls_, self.stages[to], *args, name=f"edge-{source}-{to}"
                )

    async def receive(self, message: OrchestratorMessage) -> Any:
        """Admit sessions, forget ended ones, fail sessions of a failed stage."""
        match message:
            case StartSession():
                return await self._start(message)
            case ListSessions():
                found: dict[str, list[str]] = {name: [] for name in self.stages}
                for sid, (_, path) in self.sessions.items():
                    for name in path:
                        found[name].append(sid)
                return found
            case ListStages():
                return dict(self.stages)
            case Health():
                return self._health()
            case Terminated(ref=ref):
                ended = self.by_ref.pop(ref, None)
                if ended is not None:
                    _, path = self.sessions.pop(ended)
                    for actor in path:
                        self.load[actor] -= 1
            case ChildFailed(ref=ref, reason=reason):
                await self._stage_failed(ref, reason)
        return None

    def _health(self) -> PipelineHealth:
        """Every stage actor's state as its supervisor sees it (no stage is asked)."""
        return PipelineHealth(
            stages={
                actor: StageHealth(
                    stage=actor,
                    state=_CONDITIONS[self.context.child_state(ref)],
                    restarts=self.restarts[actor],
                    sessions=self.load[actor],
                )
                for actor, ref in self.stages.items()
            }
        )

    async def _start(self, request: StartSession) -> Admitted | OmniError:
        if request.session in self.sessions:
            return SessionExistsError(
                f"session id {request.session!r} is already in use; "
                "pick another id, or wait for that session to end"
            )
        path = self.spec.stages_for(
            text=request.text, audio=request.audio, transcript=request.transcript
        )
        # Each stage's least loaded replica serves the session for its whole life.
        chosen = {name: min(self.replicas[name], key=self.load.__getitem__) for name in path}
        plan = self._plan(
            chosen, text=request.text, audio=request.audio, transcript=request.transcript
        )
        transcriber = self.spec.side_transcriber
        if transcriber not in chosen:
            transcriber = None
        n = next(self._keys)
        key = SessionKey(f"{request.session}#{n}")
        ref = await self.context.spawn(
            SessionActor,
            request.session,
            key,
            plan,
            self.deadlines,
            request.resumable,
            request.admission_deadline,
            request.channel,
            transcriber or "",
            self.spec.reply_stage,
            name=f"session-{n}",
        )
        self.context.watch(ref)
        actors = list(chosen.values())
        for actor in actors:
            self.load[actor] += 1
        self.sessions[request.session] = (ref, actors)
        self.by_ref[ref] = request.session
        entry = self.spec.entry_stage
        side = None if transcriber is None else self._ref(INPUT, transcriber, chosen[transcriber])
        return Admitted(ref, self._ref(INPUT, entry, chosen[entry]), key, side)

    def _ref(self, source: str, stage: str, actor: str) -> ActorRef[Chunk | StepChunks]:
        """Where ``source`` sends to ``stage``: its replica, or the harness's interposer."""
        return self.edge_refs.get((source, stage), self.stages[actor])

    def _plan(
        self, chosen: dict[str, str], *, text: bool, audio: bool, transcript: bool
    ) -> dict[str, StagePlan]:
        spec = self.spec
        plan: dict[str, StagePlan] = {}
        for name, actor in chosen.items():
            sources = tuple(e.source for e in spec.edges if e.to == name and e.source in chosen)
            targets = tuple(
                Target(
                    stage=e.to,
                    ref=self._ref(name, e.to, chosen[e.to]),
                    mode=e.mode,
                    fields=spec.edge_fields(e.source, e.to),
                    window=None if e.chunk_policy is None else e.chunk_policy.window(),
                    accumulate=spec.accumulate(e.to),
                    device_link=self.paths[(e.source, e.to)][0] == "device",
                    steps=True,
                )
                for e in spec.edges
                if e.source == name and e.to in chosen
            )
            emit = tuple(
                kind
                for kind, wanted in (("text", text), ("audio", audio))
                if wanted and getattr(spec.outputs, kind) == name
            )
            if transcript and name == spec.outputs.transcript:
                emit = (*emit, *TRANSCRIBER_OUTPUTS)  # beside the entry, or the entry
            plan[name] = StagePlan(self.stages[actor], sources or (INPUT,), targets, emit)
        return plan

    async def _stage_failed(self, ref: ActorRef[Any], reason: BaseException) -> None:
        actor = next((name for name, r in self.stages.items() if r == ref), None)
        if actor is None:
            return  # a session actor: its on_stop ends its session
        # Counted here, not by the supervisor: every failure of a stage is reported to
        # this parent (``ChildFailed``) whatever the supervisor then decides.
        self.restarts[actor] += 1
        stage = next(s for s, actors in self.replicas.items() if actor in actors)
        hit = [sref for sref, path in self.sessions.values() if actor in path]
        log.warning("stage %s failed (%r); failing %d session(s) on it", actor, reason, len(hit))
        where = f"replica {actor}: " if actor != stage else ""
        failed = StageFailed(
            stage=stage, error=f"{where}{type(reason).__name__}: {reason}", at=time.monotonic()
        )
        results = await asyncio.gather(*(s.tell(failed) for s in hit), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.debug("session already gone: %r", result)
