"""``SessionActor``: the caller's end of one session.

The orchestrator spawns one per session. It prewarms every stage on the session's path,
receives the output stages' chunks and turns them into events for the caller, collects
each stage's report per segment, and ends the session — ``Done``, ``SessionError`` or ``Aborted`` —
telling every stage to free what it holds when the session did not finish normally.
Events go into a :class:`SessionChannel` the caller reads; the channel is local to the
caller's process, so this actor always runs there. Its messages, and the stages', are in
``omni_actors.protocols.control``; the stages know the session by its ``SessionKey``,
the caller's events by its id.

Segments may overlap: the caller can end segment 1 while a later stage still works on
segment 0, so the thinker's reply to segment 1 arrives amid code2wav's audio for
segment 0. Every chunk and report names its segment; a segment is done when every stage
on the path has reported it, and the caller gets the segments' events in segment order
(``Session.events()`` is the reply to one segment, through its ``ResponseDone``): events
of a later segment are held here until the earlier segment's ``ResponseDone`` is out.
The hold is bounded in time by the stages' deadlines: a stalled earlier segment fails
the session, and the terminal event drops what is held.

In a conversation each segment is a response, named by the id its caller gave it
(``SessionChannel.responses``). A response ends with ``ResponseDone``: ``completed``,
``cancelled`` (the caller's :class:`CancelResponse`: every stage is told to stop it,
and its late deltas are dropped) or ``failed`` (a stage's engine failed it: the other
stages are told to stop it too). Either way the session stays open. A response's deltas
that come before its caller asks for it (an entry engine that answers a user turn while
it still arrives) are its own all the same: they wait in the channel until it is asked
for (``SessionChannel.put_delta``), and its ``ResponseDone`` names the id the caller gave
it, whenever its first output came. A truncate walks
the stages back from the audio: each keeps what the user heard of the last reply and
answers what its source keeps, down to the entry stage's share. What is asked of every
stage at once (prewarm, cancel, truncate, abort) is the session's path's
(:class:`~omni_actors.pipeline.session_path.SessionPath`).

A stage that dies (``StageFailed``), or a stream that breaks (a chunk gap, a peer gone),
fails the responses in flight (``stage_failed``, ``chunk_gap``); a conversation with a
history to replay (``SessionChannel.history``) stays open, marked stale, and the
caller's next input reopens it (``ReopenSession``: a new key on every stage, from the
segment it has come to) and replays it; any other session ends.

A session may have a transcriber (``outputs.transcript``), fed by the caller's input
beside the entry stage: its outputs become ``TranscriptDelta`` / ``TranscriptDone`` /
``TranscriptFailed`` events at once (they belong to no response, so no segment holds
them), its reports count for no response, and its failure — an engine error, a stream
that broke, its death — fails transcription only (``TranscriptFailed`` with no item:
the turns not transcribed yet), never a reply or the session. An entry stage that
transcribes (``outputs.transcript`` naming it: a cascade's recognizer) sends its
transcripts here beside its output to the next stages; they become the same events,
and the stage is the reply's in every other way.

Flow control: the output stages' streams to the caller are a
:class:`~omni_actors.pipeline.client_streams.ClientStreams`; the entry stage's credits
for the caller's input arrive here too, and go to the channel, where ``Session.send``
waits for them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from omni_actors._actor import Actor
from omni_actors._mailbox import MailboxConfig
from omni_actors.actors.engines.transcriber_ports import TRANSCRIPT_FIELD
from omni_actors.actors.stage.accumulate import ChunkGapError
from omni_actors.actors.stage.flow import send_credit
from omni_actors.errors import InvalidRequestError, OmniError, qualified_name
from omni_actors.pipeline.client_streams import ClientStreams
from omni_actors.pipeline.pending_response import PendingResponse
from omni_actors.pipeline.session_channel import SessionChannel
from omni_actors.pipeline.session_path import SessionPath, StagePlan
from omni_actors.protocols.control import (
    AbortSession,
    CancelResponse,
    Deadlines,
    OpenSession,
    RebuildSession,
    ReopenSession,
    SessionMessage,
    StageFailed,
    StreamCredit,
    Truncated,
    TruncateResponse,
)
from omni_actors.protocols.error_code import ErrorCode
from omni_actors.protocols.events import (
    Aborted,
    Done,
    Event,
    ResponseDone,
    SessionError,
    TranscriptFailed,
)
from omni_actors.protocols.stage import INPUT, Chunk, FailureCause, SessionKey, StageReport

__all__ = ["SessionActor"]

# A stage's failures that say the session's streams broke, not the reporting stage: a
# peer gone (the orchestrator's StageFailed for that peer may come after it), lost chunks.
_BROKEN_STREAM: frozenset[FailureCause | None] = frozenset({"peer_gone", "chunk_gap"})

log = logging.getLogger(__name__)


class SessionActor(Actor[SessionMessage]):
    """See the module docstring.

    Args:
        session: the session's id, chosen by its caller (in every event).
        key: the session's key on the stages (see ``SessionKey``).
        plan: the stages on the path, in topological order, with their prewarm plans.
        deadlines: the session's deadlines, passed to every stage.
        resumable: the caller sends input in segments.
        admission_deadline: system clock time by which prewarm must be complete.
        channel: where events go.
        transcriber: the stage of ``plan`` that transcribes the caller's input ("" if
            none is on the path): see the module docstring.
        replier: the stage that writes the replies (``PipelineSpec.reply_stage``), whose
            reports say what the conversation keeps of each response ("" or a stage not
            on the path: the entry stage).
    """

    receives_now = frozenset({Chunk})  # the output stages' stream (see ``receive_now``)

    mailbox = MailboxConfig(capacity=4096)

    def __init__(
        self,
        session: str,
        key: SessionKey,
        plan: dict[str, StagePlan],
        deadlines: Deadlines,
        resumable: bool,
        admission_deadline: float,
        channel: SessionChannel,
        transcriber: str = "",
        replier: str = "",
    ) -> None:
        self.id = session
        self.transcriber = transcriber
        # The stages whose reports end a response: all but the transcriber.
        self.reply_stages = [name for name in plan if name != transcriber]
        self.key = key
        self._base_key = key
        self._reopened = 0  # times the session was opened again after a stage restart
        self._cut_by = ""  # what cost the stages their replies (see ``_cut``)
        self.entry = next(
            name for name, p in plan.items() if INPUT in p.sources and name != transcriber
        )
        self.replier = replier if replier in plan else self.entry
        self.plan = plan
        self.path = SessionPath(session, key, plan, transcriber)
        self.deadlines = deadlines
        self.resumable = resumable
        self.admission_deadline = admission_deadline
        self.channel = channel
        self.streams = self._streams()
        self.segment = 0  # the segment whose events go to the caller now
        self._pending: dict[int, PendingResponse] = {}  # segments not yet done, by number
        self._last: PendingResponse | None = None  # the last response done
        self._ended = False

    async def receive(self, message: SessionMessage) -> Any:
        """Handle one message; see the module docstring."""
        match message:
            case StageReport() | StreamCredit() if message.key != self.key:
                pass  # from before the session was opened again: the stages dropped it
            case Chunk():
                rest = self._chunk(message)
                if rest is not None:
                    await rest()
            case StageReport():
                await self._report(message)
            case OpenSession():
                return await self._open()
            case AbortSession(reason=reason):
                await self._end(Aborted(session=self.id, reason=reason))
                return True
            case StageFailed(stage=stage, at=at) if self.path.opened_since(stage, at):
                # Heard of late: the session opened again on the restarted stage since.
                log.debug("session %s: %s failed before the session opened there", self.id, stage)
            case StageFailed(stage=stage, error=error) if stage == self.transcriber:
                self._transcription_failed("stage_failed", f"stage {stage} failed: {error}")
            case StageFailed(stage=stage, error=error):
                await self._cut("stage_failed", f"stage {stage} failed: {error}", stage, stage)
            case ReopenSession(timeout_s=timeout_s):
                return await self._reopen(timeout_s)
            case CancelResponse(segment=segment):
                return await self._cancel(segment)
            case TruncateResponse(audio_ms=audio_ms):
                return await self._truncate(audio_ms)
            case RebuildSession(reason=reason):
                return await self._rebuild(reason)
            case StreamCredit(source=source):
                await self._pass_credit(source, message)
        return None

    async def on_stop(self) -> None:
        """If the session has not ended yet (pipeline closing, a bug), end it now."""
        if not self._ended:
            await self._end(
                SessionError(
                    session=self.id,
                    code="internal",
                    message="the session's pipeline stopped before it ended",
                ),
                stop=False,
            )

    # -- prewarm --------------------------------------------------------------------

    async def _open(self) -> SessionError | None:
        return await self._prewarm(max(0.0, self.admission_deadline - self.context.clock.now()))

    async def _prewarm(self, timeout: float, *, again: bool = False) -> SessionError | None:
        """Prewarm every stage from the current segment on; the error that ended the
        session if one failed (``again``: when reopening after a stage restart)."""
        failed = await self.path.prewarm(
            self.context.self_ref,
            resumable=self.resumable,
            deadlines=self.deadlines,
            window=self.channel.window,
            timeout=timeout,
            segment=self.segment,
        )
        if failed is None:
            return None
        stage, result = failed
        # The phase says what failed: the deadline of admission, or the stage.
        code: ErrorCode = "admission" if isinstance(result, TimeoutError) else "prewarm"
        what = f"prewarm of stage {stage} failed"
        if again:
            code, what = "stage_failed", f"the session could not be opened again on {stage}"
        error = SessionError(
            session=self.id,
            code=code,
            message=f"{what}: {result}",
            stage=stage,
            error_type=qualified_name(result),
        )
        await self._end(error)
        return error

    # -- outputs and reports ----------------------------------------------------------

    def _reply(self, segment: int) -> PendingResponse | None:
        """The reply to ``segment``; None if that segment is already done (a bug)."""
        if segment < self.segment:
            log.warning("session %s: output or report for done segment %d", self.id, segment)
            return None
        reply = self._pending.get(segment)
        if reply is None:
            reply = self._pending[segment] = PendingResponse(
                self.channel.responses.get(segment, "")
            )
        elif not reply.response:
            # Its first outputs may come before the caller names it: an entry engine
            # that answers a turn as it arrives (``SessionChannel.put_delta``).
            reply.response = self.channel.responses.get(segment, "")
        return reply

    def receive_now(self, message: SessionMessage) -> Callable[[], Awaitable[None]] | None:
        """A chunk, handed over at once while the session is idle (see ``Actor``)."""
        assert isinstance(message, Chunk)  # the one type in ``receives_now``
        return self._chunk(message)

    def _chunk(self, chunk: Chunk) -> Callable[[], Awaitable[None]] | None:
        """Turn an output stage's chunk into the caller's events; what is left to do
        that awaits (a credit back, a broken stream), if anything."""
        if chunk.key != self.key:
            return None  # a stream cut by a stage's restart: its chunks are moot
        streams = self.streams
        outcome = streams.take(chunk, self._reply, self.segment)
        if isinstance(outcome, OmniError) and chunk.source == self.transcriber:
            return functools.partial(self._transcriber_broke, outcome)
        if isinstance(outcome, OmniError):
            end = self._cut if isinstance(outcome, ChunkGapError) else self._fail
            what = qualified_name(outcome)
            return functools.partial(end, outcome.code, str(outcome), chunk.source, error_type=what)
        if outcome:  # credits due to the sender
            return functools.partial(streams.inflow.grant, chunk.source, outcome)
        return None

    def _streams(self) -> ClientStreams:
        """The output stages' streams of the current key (see ``ClientStreams``)."""
        senders = {name: p.ref for name, p in self.plan.items() if p.emit}
        # The transcriber beside the entry, or an entry stage that transcribes.
        transcripts = next((n for n, p in self.plan.items() if TRANSCRIPT_FIELD in p.emit), "")
        return ClientStreams(
            self.id,
            self.key,
            self.channel,
            senders,
            transcripts,
            conversation=self.resumable,
        )

    async def _pass_credit(self, source: str, credit: StreamCredit) -> None:
        """A stage took chunks from ``source``: pass the credit on to that sender."""
        if source == INPUT and credit.receiver == self.transcriber:
            self.channel.transcriber_input.grant(credit.n)
        elif source == INPUT:
            self.channel.input.grant(credit.n)  # Session.send may go on
        elif source in self.plan:
            await send_credit(self.plan[source].ref, credit)

    def _transcription_failed(self, code: ErrorCode, message: str, *, lost: bool = True) -> None:
        """The turns the transcriber had not transcribed fail; if it ``lost`` the session
        (rather than failing one segment), it is sent no more input."""
        if self.channel.transcriber_lost:
            return
        if lost:
            self.channel.lose_transcriber(message)
        self.channel.put(TranscriptFailed(session=self.id, item="", code=code, message=message))

    async def _transcriber_broke(self, error: OmniError) -> None:
        """The transcriber's stream to the caller broke: transcription fails, and the
        transcriber frees the session (the replies' streams are whole)."""
        self._transcription_failed(error.code, str(error))
        await self.path.abort(str(error), only=self.transcriber)

    async def _report(self, report: StageReport) -> None:
        if self.channel.stale:
            return  # a stage died: every stream of this key is cut, its responses failed
        if report.stage == self.transcriber:
            if report.end in ("failed", "error"):
                code = report.code if report.code is not None else "engine_error"
                lost = report.end == "error"  # else it failed one segment and goes on
                self._transcription_failed(code, report.error, lost=lost)
                if lost:  # it dropped the session: free what is left
                    await self.path.abort(report.error, only=self.transcriber)
            return
        if report.end == "error":
            code = report.code if report.code is not None else "internal"
            if report.failure in _BROKEN_STREAM:
                # The session's streams broke, not the stage: a conversation goes on.
                await self._cut(code, report.error, report.stage, error_type=report.error_type)
            else:
                await self._fail(code, report.error, report.stage, report.error_type)
            return
        reply = self._reply(report.segment)
        if reply is None:
            return
        if report.stage == self.replier:
            reply.kept_reply = report.reply
        if report.stage in (self.entry, self.replier):
            # The stage failed the response and went back to where it started: the
            # writer of the replies, or an entry stage that passes the input on to it.
            reply.rolled_back |= report.end == "failed"
        if report.end == "failed":  # a notice: the stage's report of the end follows
            if reply.status == "completed":
                reply.status = "failed"
                reply.code = report.code if report.code is not None else "engine_error"
                reply.message, reply.stage = report.error, report.stage
                reply.error_type = report.error_type
                await self.streams.drop_held(reply)
                await self.path.cancel(report.segment)  # the reply is over everywhere
            return
        reply.reports[report.stage] = report.metrics
        reply.finished |= report.end == "finished"
        if len(reply.reports) == len(self.reply_stages):
            reply.done_at = time.monotonic()
            await self._advance()

    async def _advance(self) -> None:
        """End every done segment from the current one on, in order; release the events
        held for the segment that becomes current."""
        while (reply := self._pending.get(self.segment)) is not None and reply.done_at is not None:
            del self._pending[self.segment]
            start = self.channel.starts.get(self.segment, reply.done_at)
            metrics = reply.metrics(start, self.channel.sample_rate, self.reply_stages)
            if reply.finished:
                if reply.status == "failed":  # the last reply failed: so did the session
                    assert reply.code is not None
                    await self._fail(reply.code, reply.message, reply.stage, reply.error_type)
                else:
                    await self._end(Done(session=self.id, metrics=metrics), abort=False)
                return
            self.channel.put(
                ResponseDone(
                    session=self.id,
                    response=self.channel.responses.get(self.segment, reply.response),
                    segment=self.segment,
                    status=reply.status,
                    metrics=metrics,
                    code=reply.code,
                    message=reply.message,
                    stage=reply.stage,
                )
            )
            if self.channel.history is not None:
                self.channel.history.answered(
                    self.segment, reply=reply.kept_reply, rolled_back=reply.rolled_back
                )
            self._last = reply
            self.segment += 1
            self.channel.complete(self.segment)
            following = self._pending.get(self.segment)
            if following is not None:
                for event, source in following.held:
                    self.streams.put(event, source, self.segment)
                following.held.clear()

    # -- cancel and truncate -------------------------------------------------------------

    async def _cancel(self, segment: int) -> bool:
        """Stop response ``segment`` on every stage; False if it is already done."""
        if self._ended or segment < self.segment:
            return False
        reply = self._reply(segment)
        if reply is None:
            return False
        if reply.status == "completed":
            reply.status = "cancelled"
            await self.streams.drop_held(reply)
            await self.path.cancel(segment)
        return True

    async def _truncate(self, audio_ms: float) -> Truncated | InvalidRequestError:
        """How many outputs the entry stage keeps once every later stage kept what the
        user heard of the last reply (see the module docstring), and the text heard."""
        last = self._last
        if self._pending or last is None:
            why = "a response is in flight" if self._pending else "no response has ended yet"
            if not self._pending and self._cut_by:
                why = f"{self._cut_by} since the last reply"
            return InvalidRequestError(f"session {self.id}: nothing to truncate ({why})")
        samples = max(0, min(round(audio_ms * self.channel.sample_rate / 1e3), last.audio_samples))
        keeps = await self.path.truncate(samples)
        if isinstance(keeps, str):
            return InvalidRequestError(f"session {self.id}: {keeps}")
        # The text heard is the reply stage's (the entry's, or the stage after it that
        # writes the replies: the cascade's LLM), of the outputs it keeps.
        writer = self.replier
        text = None
        if writer in keeps and "text" in self.plan[writer].emit:
            text = last.heard(writer, keeps[writer])
        return Truncated(kept=keeps[self.entry], text=text)

    async def _rebuild(self, reason: str) -> bool | InvalidRequestError:
        """Free the session on every stage so that it is reopened and replayed (see
        ``RebuildSession``): the conversation the caller keeps changed."""
        if self._ended or self.segment < self.channel.segments_sent:
            why = "it has ended" if self._ended else "a response is in flight"
            return InvalidRequestError(f"session {self.id}: cannot rebuild ({why})")
        self.channel.cut(reason)
        for segment in list(self._pending):  # input still open: its streams are gone
            await self.streams.drop_held(self._pending.pop(segment))
        # The stages replay the last reply as a turn of the conversation: there is no
        # audio of it left on them to cut.
        self._last = None
        self._cut_by = reason
        await self.path.abort(reason)
        return True

    # -- a stage restarted --------------------------------------------------------------

    async def _cut(
        self, code: ErrorCode, message: str, stage: str, dead: str = "", *, error_type: str = ""
    ) -> None:
        """The session's streams broke at ``stage`` (it died: ``dead``; or chunks were
        lost): fail the responses in flight with ``code`` and, if the conversation can be
        replayed, keep the session (the caller's next input reopens it), else end it."""
        if self._ended:
            return
        history = self.channel.history
        if not self.resumable or history is None or history.lost:
            if history is not None and history.lost:
                message += f" (the conversation cannot be replayed: {history.lost})"
            await self._fail(code, message, stage, error_type, dead=dead)
            return
        self.channel.cut(message)
        now = time.monotonic()
        for segment in list(self._pending):
            if segment >= self.channel.segments_sent:  # input still open: its streams are gone
                await self.streams.drop_held(self._pending.pop(segment))
        for segment in range(self.segment, self.channel.segments_sent):
            reply = self._reply(segment)
            assert reply is not None
            reply.cut(code, stage, message, now)
        await self._advance()
        self._last = None
        self._cut_by = f"stage {stage} restarted" if dead else f"{code} at stage {stage}"
        await self.path.abort(message, skip=dead)

    async def _reopen(self, timeout_s: float) -> SessionKey | SessionError:
        """Open the session again on every stage under a new key (see ``ReopenSession``)."""
        if self.channel.terminal is not None:
            terminal = self.channel.terminal
            return SessionError(
                session=self.id,
                code=getattr(terminal, "code", "internal"),
                message="the session has ended",
            )
        if not self.channel.stale:
            return self.key
        self._reopened += 1
        self.key = key = SessionKey(f"{self._base_key}~{self._reopened}")
        self.path = SessionPath(self.id, key, self.plan, self.transcriber)
        self.streams = self._streams()
        self.channel.reopening()
        error = await self._prewarm(timeout_s, again=True)
        if error is not None:
            return error
        self.channel.reopened()
        return key

    # -- ending -----------------------------------------------------------------------

    async def _fail(
        self, code: ErrorCode, message: str, stage: str, error_type: str = "", *, dead: str = ""
    ) -> None:
        await self._end(
            SessionError(
                session=self.id, code=code, message=message, stage=stage, error_type=error_type
            ),
            dead=dead,
        )

    async def _end(
        self, event: Event, *, abort: bool = True, stop: bool = True, dead: str = ""
    ) -> None:
        """Emit the terminal event, free the session on every stage, stop this actor.

        The caller may have ended the channel already (an abort ends the caller's stream
        at once); the stages are freed all the same.
        """
        if self._ended:
            return
        self._ended = True
        self.channel.end(event)
        if abort:
            reason = getattr(event, "reason", "") or getattr(event, "message", "")
            await self.path.abort(reason, skip=dead)  # a dead stage lost the session already
        if stop:
            self.context.stop_self()
