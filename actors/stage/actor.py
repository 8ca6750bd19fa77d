"""``StageActor``: hosts one engine and every session's state on one stage.

Its ``receive`` only routes (the messages: ``omni_actors.protocols.control``), and
never waits on the engine (but for ``Truncate``): a ``Prewarm`` allocates a
:class:`StageSession` (which starts waiting for input at once), a ``Chunk`` goes into its
session's queue, an ``Abort`` (a control message, served before queued chunks) cancels
the session's task, which frees the session on the engine as it ends. A ``Cancel`` (also
a control message) stops one response of a session and keeps the session; a
``Truncate`` asks the engine to cut the session's last reply (``Truncatable``), which it
must do quickly: it runs here.
Sessions are known by their ``SessionKey``. The engine work of each session — its abort
included — runs in that session's task, owned by the stage's task scope, so one slow
session never holds up the chunks of another, and the engine sees all of them at once to
batch.

A ``StreamCredit`` (a control message, so it overtakes queued chunks) lets one of a
session's outlets send more; one for a session no longer here is ignored.

An engine on a GPU (its ``device`` is CUDA) gets the stage's :class:`StageTransfers`:
input tensors are copied to its device as its sessions read them, and outputs that
leave the process are copied to the host first, on streams of the stage's own
(``omni_actors.cuda``). Outputs for a stage in this process keep their device tensors.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from typing import Any

import msgspec
import torch

from omni_actors import remoting
from omni_actors._actor import Actor
from omni_actors._mailbox import MailboxConfig
from omni_actors.actors.engines.contract import (
    TOOLS_FIELD,
    TURN_FIELD,
    Engine,
    Ports,
    engine_busy_s,
    engine_eager_steps,
    engine_max_sessions,
    engine_step_counts,
    engine_voice,
    engine_voices,
)
from omni_actors.actors.engines.registry import build_engine, engine_type
from omni_actors.actors.stage.device_links import DeviceLinkLostError, DeviceLinks
from omni_actors.actors.stage.session import StageSession
from omni_actors.actors.stage.steps import StepRouter, unpack
from omni_actors.cuda import StageTransfers
from omni_actors.errors import EngineStartError, OmniError, ProtocolError
from omni_actors.protocols.control import (
    Abort,
    Cancel,
    Inspect,
    Prewarm,
    Refused,
    StageMessage,
    StageState,
    StreamCredit,
    Truncate,
)
from omni_actors.protocols.device import (
    DeviceChunk,
    DeviceLinkAnswer,
    DeviceLinkLost,
    DeviceLinkOffer,
    SlotsFree,
)
from omni_actors.protocols.stage import Chunk, SessionKey, StepChunks

__all__ = ["StageActor"]

log = logging.getLogger(__name__)

_ABORTED_MEMORY = 4096  # aborted session keys remembered, to refuse a late prewarm
_LINK_SLOTS = 32  # as StagingSpec.link_slots, for a stage made without a spec


class StageActor(Actor[StageMessage]):
    """One pipeline stage. Spawned by the orchestrator, locally or in a worker process.

    Args:
        name: the stage's name in the pipeline.
        kind: engine kind (a registered name or ``package.module:Class``).
        args: the engine's arguments from the pipeline definition.
        staging: how its GPU transfers copy (``StagingSpec`` fields: ``slots``,
            ``slot_bytes``, ``link_slots``, ``copies``).
    """

    replies = StageState | bool | int | Refused | DeviceLinkAnswer | None
    mailbox = MailboxConfig(capacity=4096)
    # The sessions' input streams (see ``receive_now``).
    receives_now = frozenset({Chunk, StepChunks})

    def __init__(
        self,
        name: str,
        kind: str,
        args: dict[str, Any],
        staging: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.args = args
        self.staging = staging or {}
        self.engine: Engine | None = None
        self.transfers: StageTransfers | None = None
        self.device_links: DeviceLinks | None = None
        self.router: StepRouter | None = None
        self.takes_marks = False
        self.host_inputs: frozenset[str] = frozenset()
        self.voiced_apart: frozenset[str] | None = None  # see StageSession's ``spoken``
        self.sessions: dict[SessionKey, StageSession] = {}
        # Aborted, their task still ending (the engine freeing them): still held.
        self.closing: dict[SessionKey, StageSession] = {}
        self.aborted: OrderedDict[SessionKey, None] = OrderedDict()

    async def on_start(self) -> None:
        """Build and start the engine (a failure here fails the spawn, with its reason)."""
        try:
            engine = build_engine(self.kind, self.args, where=f"stages[{self.name}].engine")
            await engine.start()
        except OmniError:
            raise
        except Exception as exc:  # the engine's own: name it; its traceback for debugging
            log.debug("stage %s: engine %s failed to start", self.name, self.kind, exc_info=True)
            raise EngineStartError(self.name, self.kind, exc) from exc
        self.engine = engine
        device = getattr(engine, "device", None)
        if isinstance(device, torch.device) and device.type == "cuda":
            staging = dict(self.staging)
            link_slots = staging.pop("link_slots", _LINK_SLOTS)
            self.transfers = StageTransfers(device, **staging)
            self.device_links = DeviceLinks(
                self.name,
                device,
                self.context.self_ref,
                self.context.tasks,
                self.transfers.outbound.waiter,
                slots=link_slots,
                slot_bytes=self.transfers.outbound.pool.slot_bytes,
            )
        died = getattr(engine, "died", None)
        if isinstance(died, asyncio.Future):
            # An engine whose model runs in processes of its own (vLLM) resolves this
            # when they die: the stage fails, and its supervisor restarts it.
            self.context.tasks.create_task(self._fail_when(died), name=f"stage {self.name} engine")
        ports = self._ports()
        self.takes_marks = TURN_FIELD in ports.inputs
        self.host_inputs = ports.host_inputs
        if TOOLS_FIELD in ports.inputs:
            self.voiced_apart = frozenset(k for k, r in ports.outputs.items() if r == "replace")
        self.router = StepRouter(self.context.tasks, self.transfers)

    def _ports(self) -> Ports:
        """Its engine's declaration (the kind's, with the stage's arguments)."""
        found = engine_type(self.kind)
        return found.ports(found.args(self.args))

    @functools.cached_property
    def outputs(self) -> frozenset[str]:
        """The fields its engine declares it yields: all an output may carry."""
        return frozenset(self._ports().outputs)

    async def _fail_when(self, died: asyncio.Future[BaseException]) -> None:
        error = await died
        log.error("stage %s: its engine died: %s", self.name, error)
        remoting.fail(self.context.self_ref, error)

    async def on_stop(self) -> None:
        """Abort every session still here, then stop the engine.

        The sessions' tasks get half the system's ``stop_timeout`` to free their state
        on the engine (what is left is the engine's own stop); any that do not end are
        logged by the task scope, and the engine's ``stop`` releases what they held.
        """
        tasks = self.context.tasks
        await tasks.cancel(self.context.system.stop_timeout / 2, f"stage {self.name} stopping")
        if self.router is not None:
            self.router.close()
            self.router = None
        if self.engine is not None:
            await self.engine.stop()
            self.engine = None
        if self.device_links is not None:
            self.device_links.close()
            self.device_links = None
        if self.transfers is not None:
            await self.transfers.close()
            self.transfers = None

    def receive_now(self, message: StageMessage) -> None:
        """A chunk, or a step's, handed over at once while the stage is idle (see
        ``Actor``)."""
        if isinstance(message, Chunk):
            self._chunk(message)
        else:
            assert isinstance(message, StepChunks)  # the other type in ``receives_now``
            self._step(message)

    def _step(self, message: StepChunks) -> None:
        """Queue each chunk of a step on its session, in order, as if each came alone.

        A step's device part is copied out of the link once for the whole step, and its
        slots go back once, whichever of its sessions are still here (none: nothing is
        copied).
        """
        device = message.device
        if device is not None:
            if not any(chunk.key in self.sessions for chunk in message.chunks):
                if self.device_links is not None:  # its sessions are gone: the rows are moot
                    self.device_links.drop(device)
                return
            try:
                fields = self._device_fields(message, device)
            except (DeviceLinkLostError, ProtocolError) as exc:
                self._fail_step(message, exc)
                return
            message = msgspec.structs.replace(
                message, packed={**message.packed, **fields}, device=None
            )
        try:
            chunks = unpack(message)
        except ProtocolError as exc:  # nothing of it can be trusted: its sessions fail
            self._fail_step(message, exc)
            return
        for chunk in chunks:
            self._chunk(chunk)

    def _device_fields(self, message: StepChunks, device: DeviceChunk) -> dict[str, torch.Tensor]:
        if self.device_links is None:
            raise DeviceLinkLostError(f"stage {self.name} got device slices but has no GPU")
        if not message.packed.keys().isdisjoint(device.slices):
            self.device_links.drop(device)
            raise ProtocolError(
                f"step chunks carry {sorted(device.slices.keys() & message.packed.keys())} "
                "both packed and on the device"
            )
        return self.device_links.take_fields(device)

    def _fail_step(self, message: StepChunks, error: Exception) -> None:
        """Nothing of ``message`` can be trusted: the sessions of its chunks fail."""
        for chunk in message.chunks:
            session = self.sessions.get(chunk.key)
            if session is not None:
                session.fail(error)

    def _chunk(self, message: Chunk) -> None:
        """Queue a chunk on its session (it never awaits: see ``receive_now``)."""
        session = self.sessions.get(message.key)
        if session is None:  # aborted or timed out meanwhile: its chunks are moot
            log.debug("%s: chunk for unknown session %s dropped", self.name, message.key)
            if message.device is not None and self.device_links is not None:
                self.device_links.drop(message.device)
            return
        if message.device is not None:
            try:
                message = self._device_part(message, message.device)
            except DeviceLinkLostError as exc:
                session.fail(exc)
                return
        session.deliver(message)

    async def receive(self, message: StageMessage) -> Any:
        """Route one message; see the module docstring."""
        match message:
            case Chunk():
                self._chunk(message)
                return None
            case StepChunks():
                self._step(message)
                return None
            case DeviceLinkOffer():
                if self.device_links is None:
                    reason = f"stage {self.name} does not compute on a GPU"
                    return DeviceLinkAnswer(accepted=False, reason=reason)
                return self.device_links.accept(message)
            case SlotsFree():
                if self.device_links is not None:
                    self.device_links.slots_free(message)
                return None
            case DeviceLinkLost():
                if self.device_links is not None:
                    self.device_links.lost(message)
                return None
            case Prewarm():
                return self._prewarm(message)
            case Abort(key=key):
                # An abort overtakes queued messages, possibly the session's own prewarm.
                self.aborted[key] = None
                if len(self.aborted) > _ABORTED_MEMORY:
                    self.aborted.popitem(last=False)
                session = self.sessions.pop(key, None)
                if session is not None:
                    # Not awaited: the session's task runs the engine's abort as it ends.
                    self.closing[key] = session
                    session.abort()
                return True
            case Cancel(key=key, segment=segment):
                session = self.sessions.get(key)
                if session is not None:
                    session.cancel(segment)
                return None
            case Truncate():
                return await self._truncate(message)
            case Inspect():
                # Sessions still being aborted hold engine state: they count as held.
                return StageState(
                    stage=self.name,
                    keys=sorted({*self.sessions, *self.closing}),
                    queued=sum(s.queued for s in self.sessions.values()),
                    voices=engine_voices(self.engine),
                    voice=engine_voice(self.engine),
                    busy_s=engine_busy_s(self.engine),
                    max_sessions=engine_max_sessions(self.engine),
                    eager_steps=engine_eager_steps(self.engine),
                    steps=engine_step_counts(self.engine),
                    links=None if self.device_links is None else self.device_links.counts(),
                )
            case StreamCredit(key=key, receiver=receiver, n=n):
                session = self.sessions.get(key)
                if session is not None:
                    session.credit(receiver, n)
                # else: the session ended here (finished or aborted): its credits with it
                return None
        raise AssertionError(f"unhandled {message!r}")  # pragma: no cover - typed union

    def _device_part(self, chunk: Chunk, device: DeviceChunk) -> Chunk:
        if self.device_links is None:
            raise DeviceLinkLostError(f"stage {self.name} got device slices but has no GPU")
        return self.device_links.take(chunk, device)

    def _prewarm(self, message: Prewarm) -> bool:
        if message.key in self.aborted or message.key in self.sessions:
            # Aborted before it arrived, or a duplicate: allocate nothing. Refused, not
            # raised: a bad request must not crash the stage and its other sessions.
            return False
        assert self.engine is not None
        context = self.context
        self.sessions[message.key] = StageSession(
            self.name,
            self.engine,
            message,
            self._session_ended,
            context.clock,
            context.tasks,
            outputs=self.outputs,
            takes_marks=self.takes_marks,
            spoken=self.voiced_apart,
            host_inputs=self.host_inputs,
            transfers=self.transfers,
            device_links=self.device_links,
            router=self.router,
        )
        return True

    async def _truncate(self, message: Truncate) -> int | Refused:
        """The engine's share of a truncate; refused, never raised: a bad request must not
        crash the stage and its other sessions."""
        truncate = getattr(self.engine, "truncate", None)
        if truncate is None:
            return Refused(reason=f"stage {self.name} ({self.kind}) cannot truncate a reply")
        if message.key not in self.sessions:
            return Refused(reason=f"stage {self.name} does not hold session {message.key}")
        try:
            kept: int = await truncate(message.key, message.kept)
        except ValueError as exc:
            return Refused(reason=f"stage {self.name}: {exc}")
        return kept

    def _session_ended(self, session: StageSession) -> None:
        for held in (self.sessions, self.closing):
            if held.get(session.key) is session:
                del held[session.key]
