"""The control plane: how a session is admitted, prewarmed, fed, ended and aborted.

The actors: the caller's ``Session`` handle, the pipeline's ``Orchestrator``, one
``SessionActor`` per session (the session's *owner*, always in the caller's process) and
the ``StageActor`` of each stage (possibly in worker processes). A session's life:

1. **Admission** — the caller asks the orchestrator to ``StartSession``; it picks the
   stages on the request's path (text only: no audio stage), spawns the session actor
   and replies with it, the entry stage and the session's :data:`SessionKey`.
   ``StartSession`` carries the caller's event channel, a process-local object, so it
   lives beside the orchestrator (``omni_actors.pipeline.orchestrator``), not here.
2. **Prewarm** — the caller asks its session actor to :class:`OpenSession`; the session
   actor asks every stage on the path to :class:`Prewarm` (where to send outputs:
   :class:`Target`; how long each wait may last: :class:`Deadlines`). Once every stage
   has answered, each holds the session's state and waits for its input.
3. **Chunks** — the caller sends chunks (:class:`~omni_actors.protocols.stage.Chunk`) to
   the entry stage; each stage streams its outputs to its targets (what its sessions
   send one target within one turn of its loop, one engine step, as one
   :class:`~omni_actors.protocols.stage.StepChunks`), and the fields the caller
   wants (``text``, ``audio``) to the session actor, which turns them into events
   (:mod:`omni_actors.protocols.events`). The data plane never passes through the
   orchestrator.
4. **Segment ends** — every stage sends a
   :class:`~omni_actors.protocols.stage.StageReport` to the session actor when a segment
   ends; once all have, the caller gets ``ResponseDone`` (the session stays open) or
   ``Done``.
5. **Responses** — in a conversation (a resumable session) each segment is a response.
   The caller's :class:`CancelResponse` (barge-in) makes the session actor tell every
   stage to :class:`Cancel` that segment: each stops its engine at the next output and
   keeps the session. :class:`TruncateResponse` cuts the last reply to what the user
   heard: the session actor asks the stages after the entry one, last first, to
   :class:`Truncate` (each answers what its source keeps), and the caller sends the
   entry stage's share as a ``truncate`` mark in its input. :class:`RebuildSession`
   (a turn was taken out of the conversation) frees the session on every stage; its
   next input opens it again and replays the conversation as it now stands.
6. **Abort** — the caller sends :class:`AbortSession`, or something fails (a stage's
   error report, a deadline, the orchestrator's :class:`StageFailed` when a stage
   crashes): the session actor ends the caller's stream and asks every stage to
   :class:`Abort`, which frees the session there.

Flow control is per (session, edge) stream: a sender has ``Prewarm.window`` chunks in
flight at most, and its receiver grants them back with :class:`StreamCredit` as they are
taken (``omni_actors.actors.stage.flow``), through the session's actor, which knows every
sender.

:class:`Inspect`, :class:`ListSessions` and :class:`ListStages` ask what is held where
(leak checks); :class:`Health` asks how every stage is (readiness, metrics). The control
messages (``Abort``, ``AbortSession``, ``StageFailed``: ``ControlMessage``) overtake
queued chunks; a ``Request[R]`` is answered with an ``R``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from omni_actors.protocols.address import ActorAddress
from omni_actors.protocols.device import DeviceLinkLost, DeviceLinkOffer, SlotsFree
from omni_actors.protocols.events import SessionError
from omni_actors.protocols.message import ControlMessage, Request
from omni_actors.protocols.stage import Chunk, SessionKey, StageReport, StepChunks

__all__ = [
    "Abort",
    "AbortSession",
    "AccumulateRule",
    "DEFAULT_WINDOW",
    "Cancel",
    "CancelResponse",
    "Deadlines",
    "EdgeMode",
    "Health",
    "Inspect",
    "LinkCounts",
    "ListSessions",
    "ListStages",
    "OpenSession",
    "PipelineHealth",
    "Prewarm",
    "Refused",
    "RebuildSession",
    "ReopenSession",
    "SessionMessage",
    "StageCondition",
    "StageFailed",
    "StageHealth",
    "StageMessage",
    "StageState",
    "StepCounts",
    "StreamCredit",
    "Target",
    "Truncate",
    "Truncated",
    "TruncateResponse",
]

EdgeMode = Literal["stream", "full"]
"""How an edge delivers: ``stream`` (each output as produced) or ``full`` (one payload,
the outputs merged by the receiver's accumulate rules, when the segment ends)."""

AccumulateRule = Literal["concat", "replace"]
"""How successive values of a field combine: ``concat`` (along dim 0, or text appended)
or ``replace`` (only the latest matters)."""

DEFAULT_WINDOW = 64
"""Chunks in flight per (session, edge) stream unless the pipeline sets ``flow.window``."""


# -- flow control (every stream of a session) --------------------------------------------


class StreamCredit(msgspec.Struct, ControlMessage, tag="stream-credit", frozen=True, kw_only=True):
    """Receiver → sender of a session's stream ``source`` → ``receiver``: ``n`` more
    chunks may be sent.

    ``source`` is a stage's name, or ``input`` for the caller; ``receiver`` a stage's
    name, or ``client`` for the caller's events. A stage sends its credits to the
    session's owner, which passes them on to ``source`` (or to the caller's ``send``):
    the owner holds a working ref to every stage, where a stage in a worker process may
    not be able to name a restarting one. The owner sends the output stages the credits
    for the caller's events as the caller reads them. A control message, so a credit
    overtakes queued chunks: the sender may be waiting for it, and there is one per half
    window of chunks at most. A credit for a session the sender no longer holds (ended,
    aborted, or lost in a restart) is dropped.
    """

    key: SessionKey
    source: str
    receiver: str
    n: int


# -- to a stage --------------------------------------------------------------------------


class Deadlines(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds a stage may wait for a session's input (or its engine's first output).

    Attributes:
        first_chunk_s: for the first chunk of a segment of a one-shot session; and, on
            every segment, for the engine's first output after the last input it took.
        inter_chunk_s: between two chunks of a segment.
        idle_s: for the first chunk of a segment of a resumable session (its caller
            decides when to speak).
        total_s: the session's whole life on this stage.
    """

    first_chunk_s: float
    inter_chunk_s: float
    idle_s: float
    total_s: float


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """Where a stage sends a session's outputs: one downstream stage.

    Attributes:
        stage: the receiver's name (used for metrics and messages).
        ref: the receiver.
        mode: see :data:`EdgeMode`.
        fields: which output fields travel on this edge.
        window: ``(initial_frames, frames, left_context, ramp)`` when the edge windows codec
            frames through a ``ChunkPolicy`` (stream edges with one tensor field).
        accumulate: the receiver's per-field rules, for ``full`` edges.
        device_link: the edge takes the ``device`` path: tensors stay on the GPU, in a
            device link's slots (``omni_actors.protocols.device``), when both stages can.
        steps: the receiver takes :class:`StepChunks` (every stage does): the sender's
            chunks of one turn, of all its sessions, go there as one message.
    """

    stage: str
    ref: ActorAddress[Chunk | StepChunks]
    mode: EdgeMode
    fields: tuple[str, ...]
    window: tuple[int, int, int, tuple[int, ...]] | None = None
    accumulate: dict[str, AccumulateRule] = {}
    device_link: bool = False
    steps: bool = False


class Prewarm(msgspec.Struct, Request[bool], tag="prewarm", frozen=True, kw_only=True):
    """Session actor → stage: allocate the session's state and wait for its input.

    The reply is True, or False if the stage refuses (the session was aborted before the
    prewarm arrived, or is already open there).

    Attributes:
        key: the session's key on the stages.
        owner: the session's actor: it receives output chunks for the caller and every
            ``StageReport``.
        sources: the streams this stage reads for the session (upstream stage names, or
            ``input`` for the entry stage); a segment ends when all of them end it.
        targets: downstream stages on the session's path (others are skipped).
        emit: output fields the owner receives (``text``, ``audio``).
        resumable: the input comes in segments (deadline between segments: ``idle_s``).
        deadlines: how long each wait may last.
        window: chunks in flight per stream, into and out of the stage (see
            :class:`StreamCredit`).
        segment: the session's segment the stage serves first: 0, or, when the session
            opens again on every stage after one of them restarted (it replays its
            conversation), the segment it has come to.
    """

    key: SessionKey
    owner: ActorAddress[Chunk | StageReport | StreamCredit]
    sources: tuple[str, ...]
    targets: tuple[Target, ...] = ()
    emit: tuple[str, ...] = ()
    resumable: bool = False
    deadlines: Deadlines
    window: int = DEFAULT_WINDOW
    segment: int = 0


class Abort(msgspec.Struct, ControlMessage, Request[bool], tag="abort", frozen=True, kw_only=True):
    """Session actor → stage: stop the session now and free its state (reply: True).

    Served before queued chunks; an abort that overtakes the session's own prewarm makes
    the stage refuse that prewarm.
    """

    key: SessionKey
    reason: str = ""


class Cancel(msgspec.Struct, ControlMessage, tag="cancel", frozen=True, kw_only=True):
    """Session actor → stage: stop the reply of segment ``segment`` at the engine's next
    output, keep the session (it reports the segment as usual once its input ended).

    Served before queued chunks; a cancel for a segment the stage has not started yet
    waits for it.
    """

    key: SessionKey
    segment: int


class Refused(msgspec.Struct, tag="refused", frozen=True, kw_only=True):
    """Stage → asker: the request cannot be served (``reason`` says why); nothing changed."""

    reason: str


class Truncate(msgspec.Struct, Request[int | Refused], tag="truncate", frozen=True, kw_only=True):
    """Session actor → stage after the entry one: keep the first ``kept`` outputs of the
    session's last reply (``Truncatable.truncate``). The reply: how many rows of its
    input those depend on, what the source stage keeps in turn; or :class:`Refused`.
    """

    key: SessionKey
    kept: int


class StepCounts(msgspec.Struct, frozen=True, kw_only=True):
    """What a stage's step loop has run since its engine started: counters, so the
    difference of two readings is what ran between them (``bench pipeline`` reports it
    per level).

    Attributes:
        steps: steps run (each one call of the model over every session's rows).
        decode_rows: single-position rows (decode steps, frames) over all steps.
        prefill_tokens: positions fed by prefill chunks.
        prefill_steps: steps that ran prefill chunks.
        step_s: seconds in steps; ``prefill_step_s`` of them in steps with prefill chunks.
        prefill_works: prefills (a prompt, a turn's rows) whose first chunk has run.
        prefill_wait_s: their waits summed, each from its submission to the start of the
            step of its first chunk: how long prompts queue before the stage computes
            them.
        decode_wait_s: each decode row's wait summed, from its submission to the start
            of its step.
        ahead_steps: decode-only steps run ahead of prefill chunks for young replies
            (``decode_ahead``).
    """

    steps: int
    decode_rows: int
    prefill_tokens: int
    prefill_steps: int
    step_s: float
    prefill_step_s: float
    prefill_works: int
    prefill_wait_s: float
    decode_wait_s: float
    ahead_steps: int = 0


class LinkCounts(msgspec.Struct, frozen=True, kw_only=True):
    """What a GPU stage's device links have sent since it started: counters, so the
    difference of two readings is what was sent between them (``bench pipeline``
    reports it per level).

    Attributes:
        placed: messages whose device tensors were copied into a link's slot.
        host: messages on an edge with a device link that took the host path: no link
            up yet, no free slot, or too big for one (``staging.slot_bytes`` sizes them).
        unmarked: placed messages with a tensor that carried no step mark
            (:mod:`omni_actors.cuda.step_ready`): their copy waited for everything the
            stage had queued on its device by then, the next step included.
    """

    placed: int
    host: int
    unmarked: int


class StageState(msgspec.Struct, tag="stage-state", frozen=True, kw_only=True):
    """Stage → asker, the reply to :class:`Inspect`: the sessions the stage holds.

    Attributes:
        stage: the stage's name.
        keys: the sessions it holds (those still being aborted included).
        queued: input chunks its sessions have received and their engine has not taken
            yet: the stage's backlog (its mailbox only routes, so chunks wait here).
        voices: the voices its engine speaks with (a response's ``voice`` option takes
            one of them); None for an engine that has none.
        voice: the one its engine speaks with when a response names none; None when
            it does not tell.
        busy_s: seconds its engine has spent in model calls since it started (the
            difference of two readings over the wall time between them: how busy the
            engine, and its device, was); None for an engine that does not tell.
        max_sessions: the most sessions its engine holds at once; None: no limit.
        eager_steps: steps its engine ran eager since it started although it replays
            them from CUDA graphs (a step larger than its largest graph, a shape whose
            graph failed or differed); None for an engine without graphs.
        steps: what its engine's step loop has run since it started; None for an
            engine without one.
        links: what its device links have sent; None for a stage without one.
    """

    stage: str
    keys: list[SessionKey]
    queued: int = 0
    voices: list[str] | None = None
    voice: str | None = None
    busy_s: float | None = None
    max_sessions: int | None = None
    eager_steps: int | None = None
    steps: StepCounts | None = None
    links: LinkCounts | None = None


class Inspect(msgspec.Struct, Request[StageState], tag="inspect", frozen=True, kw_only=True):
    """Anyone → stage: what do you hold? (leak checks, health)."""


StageMessage = (
    Prewarm
    | Chunk
    | StepChunks
    | Abort
    | Cancel
    | Truncate
    | Inspect
    | StreamCredit
    | DeviceLinkOffer
    | SlotsFree
    | DeviceLinkLost
)
"""Every message a stage accepts."""


# -- to a session's actor ----------------------------------------------------------------


class OpenSession(
    msgspec.Struct, Request[SessionError | None], tag="open-session", frozen=True, kw_only=True
):
    """Caller → session actor: prewarm every stage on the path.

    The reply is None once every stage holds the session, else the ``SessionError`` that
    also ended the caller's stream.
    """


class AbortSession(
    msgspec.Struct, ControlMessage, Request[bool], tag="abort-session", frozen=True, kw_only=True
):
    """Caller → session actor: end the session now (reply: True once every stage dropped it).

    The caller's stream ends with ``Aborted`` carrying ``reason``.
    """

    reason: str


class StageFailed(msgspec.Struct, ControlMessage, tag="stage-failed", frozen=True, kw_only=True):
    """Orchestrator → session actor: ``stage`` crashed, and the session's state there is lost.

    The responses in flight fail with code ``stage_failed``; ``error`` says what the stage
    raised. A conversation that can be replayed stays open (:class:`ReopenSession`); any
    other session fails with that code.

    ``at`` is when the orchestrator heard of the failure (``time.monotonic`` of the
    caller's process, where the orchestrator and the session actors run). A session
    that opened on ``stage`` after that, as one reopened while the stage restarted did,
    holds its state on the restarted stage: the notice is not about it.
    """

    stage: str
    error: str
    at: float


class CancelResponse(
    msgspec.Struct, ControlMessage, Request[bool], tag="cancel-response", frozen=True, kw_only=True
):
    """Caller → session actor: cancel the response of segment ``segment`` (barge-in).

    The reply is False when that response is already done. Its deltas stop reaching the
    caller; it ends with ``ResponseDone(status="cancelled")`` once every stage stopped.
    """

    segment: int


class Truncated(msgspec.Struct, frozen=True, kw_only=True):
    """Session actor → caller: what a truncation keeps of the last reply.

    Attributes:
        kept: how many outputs the entry stage keeps.
        text: the reply's text the user heard (the text of the outputs kept), when the
            stage that writes the replies (``PipelineSpec.reply_stage``) writes the
            reply's text; None otherwise.
    """

    kept: int
    text: str | None = None


class TruncateResponse(
    msgspec.Struct, Request[Truncated], tag="truncate-response", frozen=True, kw_only=True
):
    """Caller → session actor: the user heard ``audio_ms`` of the last reply; cut the
    stages' state after it. The reply: what is kept (:class:`Truncated`)."""

    audio_ms: float


class ReopenSession(
    msgspec.Struct, Request[SessionKey | SessionError], tag="reopen-session", frozen=True
):
    """Caller → session actor: a stage on the path restarted; open the session again on
    every stage, under a new key, from the segment it has come to.

    The reply is the new key, once every stage holds it (the caller then replays the
    conversation through the entry stage), or the ``SessionError`` that ended the
    session because a stage could not take it within ``timeout_s``.
    """

    timeout_s: float


class RebuildSession(msgspec.Struct, Request[bool], tag="rebuild-session", frozen=True):
    """Caller → session actor: the caller took a turn out of the conversation it keeps
    to replay (``Session.delete``); free the session on every stage, as a stage restart
    does, so that it opens again under a new key and the conversation, as it now stands,
    is replayed onto every stage.

    The reply is True, or an ``InvalidRequestError`` when a response is in flight.
    """

    reason: str


SessionMessage = (
    Chunk
    | StageReport
    | OpenSession
    | AbortSession
    | StageFailed
    | ReopenSession
    | CancelResponse
    | TruncateResponse
    | RebuildSession
    | StreamCredit
)
"""Every message a session's actor accepts."""


# -- to the orchestrator -----------------------------------------------------------------


class ListSessions(
    msgspec.Struct, Request[dict[str, list[str]]], tag="list-sessions", frozen=True, kw_only=True
):
    """Caller → orchestrator: the ids of the live sessions, by the stages they are on."""


class ListStages(
    msgspec.Struct,
    Request[dict[str, ActorAddress[StageMessage]]],
    tag="list-stages",
    frozen=True,
    kw_only=True,
):
    """Caller → orchestrator: every stage actor by name (replicas are ``<stage>-<i>``)."""


StageCondition = Literal["starting", "running", "restarting", "stopped"]
"""Where a stage actor is in its life, as its supervisor sees it: ``restarting`` from
its failure until its new instance has started (a backoff included)."""


class StageHealth(msgspec.Struct, frozen=True, kw_only=True):
    """One stage actor's health (an entry of :class:`PipelineHealth`).

    Attributes:
        stage: the actor's name (the stage's, or ``<stage>-<i>`` for a replica).
        state: see :data:`StageCondition`.
        restarts: failures it has been restarted after since the pipeline started.
        sessions: live sessions routed through it.
        queued: its backlog (:attr:`StageState.queued`); None when it did not answer
            in time (restarting, or too busy to answer).
        voices: the voices its engine speaks with (:attr:`StageState.voices`); None
            when it has none or did not answer in time.
        voice: the one it speaks with by default (:attr:`StageState.voice`).
        busy_s: seconds its engine has spent in model calls (:attr:`StageState.busy_s`;
            a restarted stage's new engine counts from 0); None when it does not tell
            or did not answer in time.
        max_sessions: the most sessions its engine holds at once
            (:attr:`StageState.max_sessions`); None: no limit, or no answer in time.
        eager_steps: steps its engine ran eager although it has CUDA graphs
            (:attr:`StageState.eager_steps`; a restarted stage's new engine counts from
            0); None for an engine without graphs, or no answer in time.
        steps: what its engine's step loop has run (:attr:`StageState.steps`; a
            restarted stage's new engine counts from 0); None for an engine without
            one, or no answer in time.
        links: what its device links have sent (:attr:`StageState.links`; a restarted
            stage counts from 0); None without one, or no answer in time.
    """

    stage: str
    state: StageCondition
    restarts: int
    sessions: int
    queued: int | None = None
    voices: list[str] | None = None
    voice: str | None = None
    busy_s: float | None = None
    max_sessions: int | None = None
    eager_steps: int | None = None
    steps: StepCounts | None = None
    links: LinkCounts | None = None


class PipelineHealth(msgspec.Struct, tag="pipeline-health", frozen=True, kw_only=True):
    """Orchestrator → caller, the reply to :class:`Health`: every stage actor's health,
    by actor name."""

    stages: dict[str, StageHealth]

    @property
    def ready(self) -> bool:
        """True when every stage actor is running (the pipeline can serve a session)."""
        return all(s.state == "running" for s in self.stages.values())


class Health(msgspec.Struct, Request[PipelineHealth], tag="health", frozen=True, kw_only=True):
    """Caller → orchestrator: how is every stage (readiness probes, metrics)?

    The orchestrator answers from what it knows as the stages' supervisor, at once; it
    does not ask the stages (``OmniPipeline.health`` adds their backlogs).
    """
