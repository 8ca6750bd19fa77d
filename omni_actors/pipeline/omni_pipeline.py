"""``OmniPipeline``: the library entry point.

::

    async with OmniPipeline("scripted-omni") as omni:
        async for event in omni.generate(text="Hello"):
            ...  # TextDelta, AudioDelta, then Done (or SessionError / Aborted)

``generate`` is a one-shot request; ``session()`` opens a resumable session whose input
arrives in segments (streaming audio in, a reply per segment, conversation state kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec
import torch

from omni_actors._actor import Actor
from omni_actors._props import Props
from omni_actors._ref import ActorRef
from omni_actors._system import ActorSystem
from omni_actors.actors.stage.actor import StageActor
from omni_actors.audio.samples import AudioInput
from omni_actors.clock import Clock
from omni_actors.errors import OmniError
from omni_actors.pipeline.orchestrator import Orchestrator, OrchestratorMessage, pipeline_strategy
from omni_actors.pipeline.session import Modality, Session
from omni_actors.pipeline.session_input import SessionClosedError
from omni_actors.pipeline.spec.pipeline import PipelineSpec, load_pipeline
from omni_actors.pipeline.voices import ANY_VOICE, VoiceMap, pipeline_voices
from omni_actors.protocols.control import (
    Health,
    Inspect,
    ListSessions,
    ListStages,
    PipelineHealth,
    StageMessage,
    StageState,
)
from omni_actors.protocols.events import TERMINAL, Event
from omni_actors.protocols.stage import Chunk, StepChunks

if TYPE_CHECKING:
    from omni_actors.pipeline.cluster_hosts import PipelineCluster
    from omni_actors.transport.worker_hosts import WorkerHost

__all__ = ["OmniPipeline"]

log = logging.getLogger(__name__)

_names = itertools.count(1)
_START_MARGIN_S = 10.0  # a stage's own start_s (and its stop) comes first, with its own error


class OmniPipeline:
    """A running pipeline: its stages, orchestrator and admission control.

    Args:
        pipeline: a :class:`PipelineSpec`, a mapping of what its YAML would hold, a
            preset name or a YAML path.
        max_sessions: sessions served at once; further requests wait for a slot, up to
            the pipeline's ``deadlines.admission_s``. Once started, no more than its
            stages hold (the least ``max_sessions`` of their engines, summed over a
            stage's replicas): :attr:`max_sessions` then says what is admitted.
        system: run inside this actor system (default: a system of its own). Its clock
            is the pipeline's: under ``ActorTestKit(virtual_time=True)``, every deadline
            enforced in this process (admission, the stages' waits, the caller's
            last-resort expiry) moves with the virtual clock; stages in worker
            processes keep real time.
        stage_classes: harness hook: per stage, an actor class used instead of
            ``StageActor`` (see ``omni_actors.testing.PipelineFaults``).
        interposers: harness hook: per edge ``"from->to"``, an actor class (and extra
            arguments) put between the two stages.
        cluster: a Ray cluster's address (``auto``, ``ray://host:port``): the pipeline's
            placed stages run there, as if its YAML said ``cluster: {ray: {address}}``.
        voice_map: voice names a caller may send besides the model's speakers and
            OpenAI's names, and the speaker each one means (``{"alloy": "ethan"}``; see
            :meth:`voices`).
    """

    def __init__(
        self,
        pipeline: PipelineSpec | Mapping[str, Any] | str | Path = "scripted-omni",
        *,
        max_sessions: int = 256,
        system: ActorSystem | None = None,
        stage_classes: dict[str, type[StageActor]] | None = None,
        interposers: dict[str, tuple[type[Actor[Chunk | StepChunks]], tuple[Any, ...]]]
        | None = None,
        cluster: str | None = None,
        voice_map: Mapping[str, str] | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.spec = load_pipeline(pipeline)
        if cluster is not None:
            self.spec = self.spec.on_cluster(cluster)
        self._cluster: PipelineCluster | None = None
        self.max_sessions = max_sessions
        self._system = system
        self._own_system = system is None
        self._stage_classes = stage_classes
        self._interposers = interposers
        self._orchestrator: ActorRef[OrchestratorMessage] | None = None
        self.voice_map: dict[str, str] = dict(voice_map or {})
        self._voices: VoiceMap | None = None  # once every stage has told its voices
        # One per session admitted and not yet closed: a session waits for one (Admission).
        self.session_slots = asyncio.Semaphore(max_sessions)

    async def __aenter__(self) -> OmniPipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the stages (``async with`` does this)."""
        if self._system is None:
            self._system = ActorSystem(f"omni-{self.spec.name}")
        system = self._system
        if self._own_system:
            await system.start()
        try:
            hosts: dict[str, WorkerHost] = {}
            if self.spec.cluster is not None:
                from omni_actors.pipeline.cluster_hosts import start_cluster  # Ray, lazily

                self._cluster = await start_cluster(self.spec)
                hosts = {} if self._cluster is None else dict(self._cluster.hosts)
            self._orchestrator = await system.spawn(
                Orchestrator,
                self.spec,
                self._stage_classes,
                self._interposers,
                hosts,
                name=f"{self.spec.name}-{next(_names)}",
                # Its start is every stage's: each within start_s, in parallel.
                props=Props(
                    strategy=pipeline_strategy(self.spec),
                    start_timeout=self.spec.deadlines.start_s + _START_MARGIN_S,
                ),
            )
            await self._admit_what_stages_hold()
        except BaseException:
            if self._own_system:
                await system.shutdown()
            await self._close_cluster()
            raise

    async def _admit_what_stages_hold(self) -> None:
        """Admit no more sessions at once than the stages hold: a stage whose engine has
        a KV slot per session (``max_sessions``) would fail the one past it inside the
        stage, mid-request; at admission it waits for a slot instead, as any session
        past ``max_sessions`` does. Before any session: the slots are not in use yet."""
        try:
            health = await self.health()
        except (OmniError, TimeoutError) as exc:
            log.warning("the stages did not tell how many sessions they hold: %r", exc)
            return
        limits: dict[str, int] = {}
        for stage in self.spec.stages:
            held = [
                health.stages[name].max_sessions
                for name in stage.replica_names()
                if name in health.stages
            ]
            if held and all(n is not None for n in held):
                limits[stage.name] = sum(n for n in held if n is not None)
        if not limits or min(limits.values()) >= self.max_sessions:
            return
        least = min(limits, key=limits.__getitem__)
        log.info(
            "%s admits %d sessions at once (stage %s holds %d; max_sessions was %d)",
            self.spec.name,
            limits[least],
            least,
            limits[least],
            self.max_sessions,
        )
        self.max_sessions = limits[least]
        self.session_slots = asyncio.Semaphore(self.max_sessions)

    async def close(self) -> None:
        """Stop every stage; sessions still open end with a ``SessionError``."""
        system, orchestrator = self._system, self._orchestrator
        self._orchestrator = None
        if system is None:
            return
        try:
            if orchestrator is not None:
                await system.stop(orchestrator)
            if self._own_system:
                await system.shutdown()
                self._system = None
        finally:
            await self._close_cluster()  # after the stages: their keepers are gone by now
            _free_models()

    async def _close_cluster(self) -> None:
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            await cluster.close()

    @property
    def clock(self) -> Clock:
        """The system clock every deadline of the pipeline reads (started pipelines)."""
        if self._system is None:
            raise RuntimeError("the pipeline is not started; use 'async with OmniPipeline(...)'")
        return self._system.clock

    def transport_counts(self) -> dict[str, int]:
        """Frames this process refused and messages lost with dead stage workers
        (``refused_frames``, ``lost_messages``; empty before any stage is in a worker)."""
        return {} if self._system is None else self._system.placement_counts()

    @property
    def orchestrator(self) -> ActorRef[OrchestratorMessage]:
        """The orchestrator's ref (raises if the pipeline is not started)."""
        if self._orchestrator is None:
            raise RuntimeError("the pipeline is not started; use 'async with OmniPipeline(...)'")
        return self._orchestrator

    async def live_sessions(self) -> dict[str, list[str]]:
        """Open sessions' ids by stage, as the orchestrator knows them."""
        return await self.orchestrator.ask(ListSessions())

    async def stages(self) -> dict[str, ActorRef[StageMessage]]:
        """Every stage's ref by name."""
        addresses = await self.orchestrator.ask(ListStages())
        # The protocol names them as addresses; in this process each is an ActorRef.
        return cast("dict[str, ActorRef[StageMessage]]", addresses)

    async def inspect(self, timeout: float = 5.0) -> dict[str, StageState]:
        """What every stage holds right now (its sessions' keys), by stage name."""
        refs = await self.stages()
        states = await asyncio.gather(*(r.ask(Inspect(), timeout=timeout) for r in refs.values()))
        return dict(zip(refs, states, strict=True))

    async def health(self, timeout: float = 2.0) -> PipelineHealth:
        """Every stage actor's state, restarts, sessions, backlog (``queued``), the
        voices its engine speaks with (``voices``: a talker's, for a server to list) and
        the seconds its engine has computed (``busy_s``), the steps it ran eager
        although it has CUDA graphs (``eager_steps``), what its step loop ran
        (``steps``) and what its device links sent (``links``).

        The orchestrator reports states, restarts and sessions; each running stage is
        asked for its backlog, ``timeout`` seconds at most, all at once. A stage that
        does not answer in time (it failed meanwhile, or is too busy to answer) is
        reported with ``queued=None`` rather than holding up a readiness probe.

        Raises:
            AskTimeoutError: the orchestrator did not answer within ``timeout``.
        """
        health = await self.orchestrator.ask(Health(), timeout=timeout)
        addresses = await self.orchestrator.ask(ListStages(), timeout=timeout)
        refs = cast("dict[str, ActorRef[StageMessage]]", addresses)  # local: see stages()
        running = [name for name, s in health.stages.items() if s.state == "running"]
        answers = await asyncio.gather(
            *(refs[name].ask(Inspect(), timeout=timeout) for name in running),
            return_exceptions=True,
        )
        stages = dict(health.stages)
        for name, answer in zip(running, answers, strict=True):
            if isinstance(answer, StageState):
                stages[name] = msgspec.structs.replace(
                    stages[name],
                    queued=answer.queued,
                    voices=answer.voices,
                    voice=answer.voice,
                    busy_s=answer.busy_s,
                    max_sessions=answer.max_sessions,
                    eager_steps=answer.eager_steps,
                    steps=answer.steps,
                    links=answer.links,
                )
            elif not isinstance(answer, Exception):
                raise answer  # cancelled: this call is
            else:  # it failed meanwhile, or is too busy: its supervisor reports the rest
                log.debug("stage %s did not report its backlog: %r", name, answer)
        return PipelineHealth(stages=stages)

    async def voices(self) -> VoiceMap:
        """The voice names a caller may send (:mod:`~omni_actors.pipeline.voices`): the
        speakers its stages report (learnt from :meth:`health` once every stage has
        answered; until then, from those that did), OpenAI's voice names and
        ``voice_map``. ``Session.respond`` and the server check voices here.

        Raises:
            VoiceMapError: ``voice_map`` names a voice the model does not have.
        """
        if self._voices is not None:
            return self._voices
        try:
            health = await self.health()
        except (OmniError, RuntimeError) as exc:  # RuntimeError: the pipeline is closed
            log.warning("the pipeline did not tell its voices (asked again later): %r", exc)
            return ANY_VOICE
        speakers, default, complete = pipeline_voices(health)
        configured = self.voice_map if complete or speakers else None
        found = VoiceMap.of(speakers, configured, default)
        if complete:
            self._voices = found
        return found

    def generate(
        self,
        text: str | None = None,
        audio: AudioInput | None = None,
        *,
        sample_rate: int | None = None,
        modalities: tuple[Modality, ...] = ("text", "audio"),
        session_id: str | None = None,
    ) -> AsyncIterator[Event]:
        """One request: its events as they are produced, ending with a terminal event.

        ``audio`` and ``sample_rate`` are taken as ``Session.send`` takes them (a tensor,
        an array or PCM16 bytes; audio at another rate than the pipeline's
        ``inputs.sample_rate`` is resampled to it).
        Stopping the iteration early (``break``, ``aclose``, cancelling the task) aborts
        the session on every stage.
        """
        return self._generate(text, audio, sample_rate, modalities, session_id)

    async def _generate(
        self,
        text: str | None,
        audio: AudioInput | None,
        sample_rate: int | None,
        modalities: tuple[Modality, ...],
        session_id: str | None,
    ) -> AsyncIterator[Event]:
        session = Session(self, modalities=modalities, session_id=session_id, resumable=False)
        try:
            error = await session.open()
            if error is not None:
                yield error
                return
            # It may end meanwhile (a deadline): its terminal event then says why.
            with contextlib.suppress(SessionClosedError):
                await session.send(text=text, audio=audio, sample_rate=sample_rate, end="finished")
            # The session's channel read here, not through its own iterator: one async
            # generator per event, not two (this runs once per event of every request).
            get = session.channel.get
            while True:
                event = await get()
                yield event
                if isinstance(event, TERMINAL):
                    return
        finally:
            await session.close()

    def session(
        self,
        *,
        modalities: tuple[Modality, ...] = ("text", "audio"),
        session_id: str | None = None,
        transcription: bool = False,
    ) -> Session:
        """A resumable session: ``async with omni.session() as s: ...``.

        ``transcription``: the session may transcribe what its caller says
        (``Session.transcribe``): the pipeline's transcriber joins its stages.

        Raises:
            InvalidRequestError: ``transcription`` on a pipeline without a transcriber.
        """
        return Session(
            self,
            modalities=modalities,
            session_id=session_id,
            resumable=True,
            transcription=transcription,
        )


def _free_models() -> None:
    """Give back the memory of the models the stopped stages held in this process.

    A loaded model is its own reference cycle (its modules, and the step functions its
    decoders and graphs keep, point back at it), so it outlives its stage until the
    garbage collector next runs, which an allocation on a GPU never triggers: a model
    loaded next in the process (another pipeline, a level of a benchmark) could then
    find its GPU still holding the last one's weights. Collect now, and hand the freed
    blocks back to the driver, for other processes too.
    """
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()
