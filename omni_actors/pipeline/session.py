"""``Session``: the caller's handle on one session of an :class:`OmniPipeline`.

``OmniPipeline.session()`` returns one for a conversation; ``generate`` drives one for a
one-shot request.

A conversation, as a voice agent holds it: :meth:`Session.send` appends input (the
entry stage prefills it as it arrives), :meth:`Session.commit` makes the uncommitted
input a user turn, :meth:`Session.clear` drops it (every stage rolls back what it
prefilled), :meth:`Session.respond` starts a reply to the conversation so far and
returns its :class:`~omni_actors.pipeline.response.Response`, which can be cancelled
(barge-in); :meth:`Session.truncate` cuts the last reply to what the user heard,
:meth:`Session.delete` takes a turn out of the conversation, and
:meth:`Session.add_reply` adds an assistant turn the caller holds (a chat's history). One
response is in flight at a time: ``respond`` while one is raises
``InvalidRequestError`` rather than queueing the reply, because a voice agent that
answers twice must decide which answer the user hears (cancel the first, or wait for
its ``ResponseDone``). A response's failure ends that response only; the session ends
on ``finish``, ``abort``, a failed admission, a deadline or a stage crash.

The handle sends input straight to the entry stage (as chunks numbered within the credit
window the entry stage grants: :class:`~omni_actors.pipeline.session_input.SessionInput`),
reads the events its session actor queues, and owns the session's admission
(:class:`~omni_actors.pipeline.admission.Admission`, with its slot) and last-resort
deadline. Both deadlines read the pipeline's system clock (``ActorSystem.clock``), so a
pipeline in a system with a virtual clock runs them on virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Literal

import msgspec
import torch

from omni_actors._ref import ActorRef
from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    REPLY_FIELD,
    TOOL_CALLS_FIELD,
    TOOLS_FIELD,
    TURN_FIELD,
)
from omni_actors.actors.engines.transcriber_ports import LANGUAGE_FIELD, PROMPT_FIELD
from omni_actors.audio.samples import AudioInput, audio_tensor
from omni_actors.clock import TimerHandle
from omni_actors.errors import InvalidRequestError, OmniError
from omni_actors.pipeline.admission import Admission
from omni_actors.pipeline.conversation_log import ConversationLog
from omni_actors.pipeline.orchestrator import StartSession
from omni_actors.pipeline.response import Response, checked_options
from omni_actors.pipeline.send_checks import check_send
from omni_actors.pipeline.session_channel import SessionChannel
from omni_actors.pipeline.session_input import SessionClosedError, SessionInput
from omni_actors.protocols.control import (
    AbortSession,
    CancelResponse,
    RebuildSession,
    ReopenSession,
    SessionMessage,
    Truncated,
    TruncateResponse,
)
from omni_actors.protocols.events import (
    TERMINAL,
    Aborted,
    AudioDelta,
    Event,
    ResponseDone,
    SessionError,
    TextDelta,
)
from omni_actors.protocols.stage import (
    End,
    Mark,
    ResponseOptions,
    SessionKey,
)

if TYPE_CHECKING:
    from omni_actors.pipeline.omni_pipeline import OmniPipeline
    from omni_actors.pipeline.spec.pipeline import PipelineSpec

__all__ = ["CancelTimeoutError", "Modality", "Session"]

Modality = Literal["text", "audio"]

_GRACE_S = 5.0  # beyond total_s: the stages' own deadline fires first
_ABORT_TIMEOUT_S = 10.0


class CancelTimeoutError(OmniError, TimeoutError):
    """A cancelled response was not ended by every stage within the abort deadline."""

    code = "timeout"


class Session:
    """The caller's handle on one session (``OmniPipeline.session()`` or ``generate``).

    Send input with :meth:`send`; end a segment with :meth:`end_segment` (the pipeline
    replies, then waits for the next segment with the session's state kept) or the
    session with :meth:`finish`. Iterate :meth:`events` for one segment's events, or
    the session itself for all of them up to the terminal event.
    """

    def __init__(
        self,
        pipeline: OmniPipeline,
        *,
        modalities: tuple[Modality, ...],
        session_id: str | None,
        resumable: bool,
        transcription: bool = False,
    ) -> None:
        unknown = set(modalities) - {"text", "audio"}
        if unknown or not modalities:
            raise ValueError(f"modalities must be 'text' and/or 'audio', got {modalities!r}")
        if transcription and pipeline.spec.outputs.transcript is None:
            raise InvalidRequestError(
                f"pipeline {pipeline.spec.name} has no transcriber (outputs.transcript); "
                "open the session without transcription"
            )
        self.transcription = transcription
        self.pipeline = pipeline
        self.id = session_id or uuid.uuid4().hex
        self.modalities = modalities
        self.resumable = resumable
        self._takes = pipeline.spec.entry_inputs()
        self.channel = SessionChannel(
            sample_rate=pipeline.spec.outputs.sample_rate,
            window=pipeline.spec.flow.window,
            history=_history(pipeline.spec, self._takes) if resumable else None,
        )
        self._ref: ActorRef[SessionMessage] | None = None
        self._key = SessionKey("")  # the session's key on the stages, once admitted
        self._input = SessionInput(
            self.id,
            self.channel,
            sample_rate=pipeline.spec.inputs.sample_rate,
            entry_stage=pipeline.spec.entry_stage,
            clock=pipeline.clock,
            credit_wait_s=pipeline.spec.deadlines.inter_chunk_s,
            abort_stages=self._abort_stages,
            reopen=self._reopen,
            replay_s=_reopen_s(pipeline.spec),
            entry_transcribes=pipeline.spec.outputs.transcript == pipeline.spec.entry_stage,
        )
        self._admission: Admission | None = None
        self._drained = False  # the terminal event has been handed to the caller
        self._cancelled = ""  # the response whose deltas the caller is no longer handed
        self._expiry: TimerHandle | None = None
        self._expiring: asyncio.Task[None] | None = None
        self.response: Response | None = None  # the last one started

    async def __aenter__(self) -> Session:
        error = await self.open()
        if error is not None:
            await self.close()
            raise SessionClosedError(f"session {self.id} could not open: {error.message}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def ended(self) -> bool:
        """True once the terminal event has been emitted."""
        return self.channel.terminal is not None

    async def open(self) -> SessionError | None:
        """Admission and prewarm, within ``deadlines.admission_s``; an error is returned."""
        spec = self.pipeline.spec
        clock = self.pipeline.clock
        self.channel.segment_started(0)
        start = clock.now()
        # The caller's last line of defence: the stages' own deadlines fire first.
        self._expiry = clock.call_at(start + spec.deadlines.total_s + _GRACE_S, self._expire)
        self._admission = Admission(
            self.pipeline,
            StartSession(
                self.id,
                "text" in self.modalities,
                "audio" in self.modalities,
                self.resumable,
                start + spec.deadlines.admission_s,
                self.channel,
                self.transcription,
            ),
        )
        admitted = await self._admission.admit()
        if isinstance(admitted, SessionError):
            return admitted
        self._ref, self._key = admitted.session, admitted.key
        self._input.connect(admitted.entry, admitted.key, admitted.transcriber)
        return await self._admission.prewarm(admitted)

    async def send(
        self,
        *,
        text: str | None = None,
        audio: AudioInput | None = None,
        sample_rate: int | None = None,
        fields: Mapping[str, torch.Tensor | str] | None = None,
        end: End = "",
    ) -> None:
        """Append input (``text``, ``audio`` samples, or named ``fields``) to the turn.

        ``audio`` is mono, one of:

        - a 1-D ``torch.Tensor`` of float samples in [-1, 1] or int16 PCM samples;
        - a 1-D numpy array of float16/float32/float64 samples in [-1, 1] or int16;
        - ``bytes``, ``bytearray`` or ``memoryview``: 16-bit little-endian PCM (what
          microphones and websockets hand an app).

        int16 samples are scaled to floats in [-1, 1) (divided by 32768). Arrays and bytes
        are copied: their buffer may be reused once this returns. At a ``sample_rate``
        other than the pipeline's (``inputs.sample_rate``) the audio is resampled as one
        stream: pieces join without clicks, and the last samples of a turn are sent
        when it is committed or answered.

        ``end`` ends the current segment (``segment``: the pipeline answers it, as
        :meth:`respond` does, but segments may overlap: one may end while the reply to
        the previous one is still being voiced, and the replies come in order) or the
        session (``finished``: the last input is answered, then the session ends).

        Once a window of input chunks (``flow.window``) is in flight, this waits until the
        entry stage takes some, ``deadlines.inter_chunk_s`` at most (so do ``commit``,
        ``clear``, ``respond`` and ``truncate``, which send a chunk each).

        Raises:
            SessionClosedError: the session has ended (its terminal event says why).
            InvalidRequestError: the input is not one the entry stage takes (see
                :func:`~omni_actors.pipeline.send_checks.check_send`), ``audio`` is not
                one of the above (a type or dtype not listed, not 1-D, an odd number of
                PCM16 bytes) or has a NaN or infinite sample, or ``sample_rate`` is not
                one a session takes; nothing was sent.
            BackpressureError: the entry stage took none of the input in flight within
                ``deadlines.inter_chunk_s``; the session has ended with that error.
        """
        payload: dict[str, torch.Tensor | str] = dict(fields or {})
        samples = None if audio is None else audio_tensor(audio)  # arrays and bytes, once
        check_send(
            self.id,
            text=text,
            audio=samples,
            fields=payload,
            takes=self._takes,
            limit=self.pipeline.spec.inputs.max_send_bytes,
        )
        if text is not None:
            payload["text"] = text
        if samples is not None:
            resampled = self._input.audio.take(samples, sample_rate)
            if resampled.numel():
                payload["audio"] = resampled
        elif sample_rate is not None:
            raise InvalidRequestError("sample_rate describes audio; none was sent")
        if end:
            await self._flush_audio()
        if end == "segment":
            self._check_open()
            self._start_response(uuid.uuid4().hex)
            await self._input.send(payload, end=end, options=ResponseOptions())
            return
        self._check_open()
        if end and (self.resumable or self._input.segment > 0):
            # A segment's latency counts from the end of its input; a one-shot request's
            # from the call (admission and prewarm included). The last reply is asked
            # for: what the entry engine answered of it already goes out.
            self.channel.response_started(self._input.segment)
        await self._input.send(payload, end=end)

    async def commit(self, *, turn: str = "") -> None:
        """Make the input since the last commit a user turn; no reply is started.

        Args:
            turn: the caller's id for the turn: :meth:`delete` takes it out by it, and
                its transcript event names it (``TranscriptDone.item``) while the session
                transcribes (:meth:`transcribe`).

        Raises:
            SessionClosedError: the session has ended.
        """
        await self._mark("commit", turn)

    async def transcribe(
        self, enabled: bool = True, *, language: str | None = None, prompt: str | None = None
    ) -> None:
        """Transcribe what the caller says from now on (or, ``enabled=False``, no more).

        The pipeline's transcriber (``outputs.transcript``) hears the audio sent from now
        on, beside the entry stage; each committed user turn with audio gets
        ``TranscriptDelta`` pieces as it is transcribed (from a transcriber that
        streams), then one :class:`~omni_actors.protocols.events.TranscriptDone` or
        ``TranscriptFailed``, as soon as it is transcribed (the replies never wait for
        it). A turn under way is transcribed from here on. ``language`` (an ISO-639-1
        code) and ``prompt`` (text that guides the transcription) apply to the turns
        from now on. An entry stage that transcribes (a cascade's recognizer) hears
        every turn for the stages after it: it tells the caller those committed while
        transcribing, and its settings are the reply's too.

        Raises:
            InvalidRequestError: the session was opened without transcription
                (``OmniPipeline.session(transcription=True)``).
            SessionClosedError: the session has ended.
        """
        if not self.transcription:
            raise InvalidRequestError(
                f"session {self.id} was opened without transcription; open it with "
                "transcription=True"
            )
        self._check_open()
        settings = {LANGUAGE_FIELD: language or "", PROMPT_FIELD: prompt or ""}
        await self._input.transcribe(enabled, settings)

    async def clear(self) -> None:
        """Drop the input since the last commit; every stage rolls back what it prefilled.

        Raises:
            SessionClosedError: the session has ended.
        """
        await self._mark("clear")

    async def add_reply(self, text: str, *, tool_calls: str | None = None, turn: str = "") -> None:
        """Add an assistant turn saying ``text`` to the conversation; nothing is generated.

        For a history the caller holds (earlier replies of a chat, an assistant item):
        the open user turn is committed, then the engine that holds the conversation
        (the entry's, or the one the entry passes it on to: a cascade's LLM) takes
        ``text`` into it as its chat template renders an assistant turn, exactly as if it
        had said it (a later :meth:`truncate` can cut it; a conversation replayed after a
        stage restart keeps it). The stages after the entry get what a generated reply
        leaves them for later turns (Qwen3-Omni's talker conditions on user turns only).

        Args:
            text: the turn's words ("" for a turn of tool calls alone).
            tool_calls: the tools the turn called, a JSON array of ``{"type":
                "function", "function": {"name": ..., "arguments": "<JSON text>"}}``
                (None: it called none). The turn then goes as a ``reply`` mark's
                ``TOOL_CALLS_FIELD``, which the entry engine renders, words and calls, as
                its chat template writes such a turn.
            turn: the turn's id, by which :meth:`delete` can take it out later.

        Raises:
            SessionClosedError: the session has ended.
            InvalidRequestError: ``text`` is not a str or is over ``inputs.max_send_bytes``,
                ``tool_calls`` is not a JSON array, or the entry stage cannot take the
                turn (its engine declares no ``REPLY_FIELD``, or no ``TOOL_CALLS_FIELD``
                for a turn with calls: it keeps no conversation, or takes no tools).
        """
        if not isinstance(text, str):
            raise InvalidRequestError(f"text must be a str, not {type(text).__name__}")
        payload: dict[str, str]
        if tool_calls is None:
            if REPLY_FIELD not in self._takes or "text" not in self._takes:
                raise InvalidRequestError(
                    f"the entry stage {self.pipeline.spec.entry_stage} cannot take an "
                    f"assistant turn: its engine declares no {REPLY_FIELD!r} input (it keeps "
                    "no conversation, or cannot be given one)"
                )
            payload = {"text": text}
        else:
            if TOOL_CALLS_FIELD not in self._takes:
                raise InvalidRequestError(
                    f"the entry stage {self.pipeline.spec.entry_stage} cannot take an "
                    f"assistant turn that called tools: its engine declares no "
                    f"{TOOL_CALLS_FIELD!r} input (it takes no tools)"
                )
            try:
                calls = json.loads(tool_calls)
            except (TypeError, ValueError) as exc:
                raise InvalidRequestError(f"tool_calls must be a JSON array ({exc})") from None
            if not isinstance(calls, list) or not calls:
                raise InvalidRequestError("tool_calls must be a JSON array of one call or more")
            payload = {TOOL_CALLS_FIELD: json.dumps({"content": text or None, "tool_calls": calls})}
        limit = self.pipeline.spec.inputs.max_send_bytes
        size = sum(len(v) for v in payload.values())
        if size > limit:
            raise InvalidRequestError(
                f"session {self.id}: an assistant turn of {size} characters is larger "
                f"than inputs.max_send_bytes ({limit})"
            )
        self._check_open()
        await self._flush_audio()  # the open turn's last samples, before the reply
        await self._input.send(payload, mark="reply", turn=turn)

    async def respond(
        self,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        voice: str | None = None,
        response_id: str | None = None,
        instructions: str | None = None,
        tools: str | None = None,
    ) -> Response:
        """Start a reply to the conversation so far (any uncommitted input is committed).

        Audio sent at another rate than the pipeline's is resampled as one stream; its
        last samples are sent first, with the turn they end (as :meth:`commit` does).

        Args:
            max_tokens: the reply's most text tokens (default: the thinker's setting).
            temperature: sampling temperature, 0 for greedy (default: the engine's).
            voice: the speaker (default: the talker's setting): one of the model's
                speakers, an OpenAI voice name or a name of the pipeline's
                ``voice_map`` (``OmniPipeline.voices``), as the server takes them.
            response_id: the response's id (default: a new one).
            instructions: a system prompt for this reply alone (the entry engine must
                take instructions): the thinker follows them, placed right before the
                reply, and the conversation keeps the reply without them, as if they
                had never been given. The conversation's own instructions (sent as the
                ``instructions`` field) stay. None or "": none.
            tools: tools for this reply alone (the entry engine must take tools), as the
                ``tools`` field takes them: offered with ``instructions`` in the system
                turn before the reply, and left out of the conversation as they are.
                The conversation's own tools stay. None or "[]": none.

        Raises:
            SessionClosedError: the session has ended.
            InvalidRequestError: a response is in flight, an override is out of range,
                ``instructions`` or ``tools`` are given to an entry stage that takes
                none, or the session is a one-shot request.
            UnknownVoiceError: ``voice`` names none of the model's voices (nothing was
                sent; the error lists the names taken).
        """
        options = checked_options(
            max_tokens, temperature, voice, instructions=instructions, tools=tools
        )
        if options.voice is not None:
            # Checked before anything is sent, as the server checks it: a voice the
            # talker lacks would otherwise fail the reply late, after its text.
            speaker = (await self.pipeline.voices()).speaker(options.voice)
            options = msgspec.structs.replace(options, voice=speaker)
        if options.tools is not None and TOOLS_FIELD not in self._takes:
            raise InvalidRequestError(
                f"the entry stage {self.pipeline.spec.entry_stage} takes no tools: "
                "a response cannot have tools of its own"
            )
        if options.instructions is not None and INSTRUCTIONS_FIELD not in self._takes:
            raise InvalidRequestError(
                f"the entry stage {self.pipeline.spec.entry_stage} takes no instructions: "
                "a response cannot have instructions of its own"
            )
        self._check_respond()
        # The resampler's last samples belong to this turn, not to the next one.
        await self._flush_audio()
        response = self._start_response(response_id or uuid.uuid4().hex)
        await self._input.send({}, end="segment", options=options)
        return response

    async def end_segment(self) -> Response:
        """Commit the input and respond to it: :meth:`respond` with no overrides."""
        return await self.respond()

    async def truncate(self, audio_ms: float) -> str | None:
        """Cut the last reply to its first ``audio_ms`` of audio (what the user heard).

        Every stage rolls its state back past that point (the thinker keeps only the
        text that was spoken), so the next reply follows the conversation as heard.

        Returns:
            The reply's text as heard: the text of what the stage that writes the
            replies keeps (the entry, or the cascade's LLM; None when that stage
            writes no text to the caller).

        Raises:
            SessionClosedError: the session has ended.
            InvalidRequestError: a response is in flight (cancel it first), no response
                has ended yet, ``audio_ms`` is negative, or a stage cannot truncate.
        """
        if not (isinstance(audio_ms, int | float) and math.isfinite(audio_ms) and audio_ms >= 0):
            raise InvalidRequestError(f"audio_ms must be a number >= 0, got {audio_ms!r}")
        self._check_open()
        if self._in_flight():
            raise InvalidRequestError(
                f"session {self.id}: a response is in flight; cancel it before truncating"
            )
        assert self._ref is not None
        kept: object = await self._ref.ask(
            TruncateResponse(audio_ms=float(audio_ms)), timeout=_ABORT_TIMEOUT_S
        )
        if isinstance(kept, OmniError):
            raise kept
        assert isinstance(kept, Truncated)
        await self._input.send({}, mark="truncate", kept=kept.kept)
        return kept.text

    @property
    def deletes_turns(self) -> bool:
        """Whether :meth:`delete` can take turns out of the conversation: the entry
        engine rebuilds its conversation from a replay (it takes its replies back, or
        passes them on to the stage that does), or keeps none."""
        history = self.channel.history
        return history is not None and not history.lost

    async def delete(self, turn: str) -> bool:
        """Take a turn out of the conversation: no later reply sees it.

        ``turn`` is a user turn's id (given to :meth:`commit`), an assistant turn's (given
        to :meth:`add_reply`) or a response's id (its reply goes, with the truncations
        of it). The session keeps its conversation to
        replay onto restarted stages (:mod:`~omni_actors.pipeline.conversation_log`);
        the turn is taken out of it, every stage lets the session go, and the session
        opens again and replays the conversation as it now stands, as after a stage
        restart: a middle turn costs a prefill of the whole conversation, and the last
        reply can no longer be truncated.

        Returns:
            Whether a turn was taken out (False: the stages hold no such turn, or the
            entry engine keeps no conversation).

        Raises:
            SessionClosedError: the session has ended.
            InvalidRequestError: a response is in flight (cancel it first), or the
                conversation cannot be replayed (:attr:`deletes_turns`).
        """
        self._check_open()
        if self._in_flight():
            raise InvalidRequestError(
                f"session {self.id}: a response is in flight; cancel it or wait for its "
                "ResponseDone before deleting a turn"
            )
        history = self.channel.history
        if history is None:
            raise InvalidRequestError(
                f"session {self.id}: the entry engine keeps a conversation it cannot "
                "rebuild (it takes no reply marks): turns cannot be deleted"
            )
        if history.lost:
            raise InvalidRequestError(f"session {self.id}: turns cannot be deleted: {history.lost}")
        if not history.records:
            return False
        segment = next((s for s, r in self.channel.responses.items() if r == turn), None)
        deleted = (
            history.delete_reply(segment) if segment is not None else history.delete_turn(turn)
        )
        if not deleted:
            return False
        assert self._ref is not None
        rebuilt: object = await self._ref.ask(
            RebuildSession(reason=f"turn {turn} was deleted"), timeout=_ABORT_TIMEOUT_S
        )
        if isinstance(rebuilt, OmniError):
            raise rebuilt
        await self._input.rebuild()
        return True

    async def cancel_response(self, response: Response) -> bool:
        """Stop ``response`` on every stage (``Response.cancel``); False if it had ended.

        From the call on, the caller is handed none of its text or audio deltas: those
        already queued are dropped (their chunks count as read), later ones are dropped
        on their way. It returns once the response's ``ResponseDone`` is queued, so the
        next ``respond`` or ``truncate`` works at once, whether or not the caller has
        read that far.

        Raises:
            CancelTimeoutError: the stages did not end the response within the abort
                deadline (a stage is stuck; the session's deadlines end it).
        """
        if self.ended or self._ref is None or response.segment < self.channel.completed:
            return False
        # Set before the first await: a reader in another task drops its deltas from now.
        self._cancelled = response.id
        try:
            cancelled = await self._ref.ask(
                CancelResponse(segment=response.segment), timeout=_ABORT_TIMEOUT_S
            )
        except OmniError:  # the session actor is gone: so is the reply
            return False
        if not cancelled:
            return False
        await self.channel.drop_deltas(response.id)
        try:
            async with asyncio.timeout(_ABORT_TIMEOUT_S):
                await self.channel.wait_completed(response.segment)
        except TimeoutError:
            raise CancelTimeoutError(
                f"session {self.id}: response {response.id} was cancelled on every stage "
                f"but not ended within {_ABORT_TIMEOUT_S:g} s"
            ) from None
        return True

    def _check_open(self) -> None:
        if self.ended or not self._input.connected:
            raise SessionClosedError(f"session {self.id} has ended; open a new one")

    def _in_flight(self) -> bool:
        return self._input.segment > self.channel.completed

    def _check_respond(self) -> None:
        self._check_open()
        if not self.resumable:
            raise InvalidRequestError("a one-shot request has one reply; open a session")
        if self._in_flight():
            current = self.response.id if self.response is not None else "?"
            raise InvalidRequestError(
                f"session {self.id}: response {current} is in flight; cancel it or wait "
                "for its ResponseDone"
            )

    def _start_response(self, response_id: str) -> Response:
        segment = self._input.segment
        self.channel.response_started(segment, response_id)  # latency counts from here
        self.response = Response(self, response_id, segment)
        return self.response

    async def _mark(self, mark: Mark, turn: str = "") -> None:
        self._check_open()
        if mark == "clear":
            self._input.audio.drop()  # what it holds is dropped with the rest
        else:
            await self._flush_audio()
        await self._input.send({}, mark=mark, turn=turn)

    async def _flush_audio(self) -> None:
        """Send the end of the resampled audio stream before a turn boundary."""
        tail = self._input.audio.flush()
        if tail.numel():
            await self._input.send({"audio": tail})

    async def finish(self) -> None:
        """End the last segment and the session."""
        await self.send(end="finished")

    async def abort(self, reason: str = "aborted by the caller") -> None:
        """End the session now on every stage; the event stream ends with ``Aborted``.

        The caller's stream ends at once; this returns once every stage has dropped the
        session (or its session actor is gone). Each stage's engine frees its state in
        the background, in the session's own task: a slow engine abort holds up nobody.
        """
        if self.channel.end(Aborted(session=self.id, reason=reason)):
            await self._abort_stages(reason)

    async def _reopen(self) -> SessionKey:
        """Open the session again on every stage after one restarted: its new key."""
        timeout = _reopen_s(self.pipeline.spec)
        assert self._ref is not None
        try:
            reopened = await self._ref.ask(
                ReopenSession(timeout_s=timeout), timeout=timeout + _GRACE_S
            )
        except (OmniError, TimeoutError) as exc:
            reopened = SessionError(
                session=self.id, code="stage_failed", message=f"could not reopen: {exc!r}"
            )
            if self.channel.end(reopened):
                await self._abort_stages("stage_failed")
        if isinstance(reopened, SessionError):
            raise SessionClosedError(f"session {self.id} has ended: {reopened.message}")
        self._key = reopened
        return reopened

    async def _abort_stages(self, reason: str) -> None:
        if self._ref is not None:
            # If the session actor is gone, so is the session.
            with contextlib.suppress(OmniError):
                await self._ref.ask(AbortSession(reason=reason), timeout=_ABORT_TIMEOUT_S)

    async def close(self) -> None:
        """Abort if not ended; give the admission slot back."""
        try:
            if not self.ended:
                await self.abort("closed before it ended")
            if self._expiring is not None:
                await self._expiring
        finally:
            if self._expiry is not None:
                self._expiry.cancel()
            if self._admission is not None:
                self._admission.release()

    def _expire(self) -> None:
        error = SessionError(
            session=self.id,
            code="timeout",
            message=(
                "the session outlived deadlines.total_s "
                f"({self.pipeline.spec.deadlines.total_s:g}s) and its stages did not end it"
            ),
        )
        if self.channel.end(error):
            # Owned by this session: ``close`` waits for it.
            self._expiring = asyncio.get_running_loop().create_task(
                self._abort_stages("deadline"), name=f"expire session {self.id}"
            )

    async def next_event(self) -> Event:
        """The next event for the caller (a ``SessionError`` once the session outlives
        its deadline); deltas of a cancelled response are never handed out."""
        get = self.channel.get
        while True:
            event = await get()
            if isinstance(event, TextDelta | AudioDelta):
                if event.response and event.response == self._cancelled:
                    continue  # on its way when the cancel came
            elif isinstance(event, TERMINAL):
                self._drained = True
            return event

    @property
    def drained(self) -> bool:
        """True once the terminal event has been handed to the caller."""
        return self._drained

    async def events(self) -> AsyncIterator[Event]:
        """The current response's events, through ``ResponseDone`` or the terminal event."""
        while not self._drained:
            event = await self.next_event()
            yield event
            if isinstance(event, ResponseDone):
                return

    async def __aiter__(self) -> AsyncIterator[Event]:
        while not self._drained:
            yield await self.next_event()


def _reopen_s(spec: PipelineSpec) -> float:
    """How long reopening a session after a stage restart may take: the restart, then a
    prewarm."""
    return spec.deadlines.start_s + spec.deadlines.admission_s


def _history(spec: PipelineSpec, takes: frozenset[str]) -> ConversationLog | None:
    """What a conversation keeps to replay after a stage restart (``ConversationLog``):
    everything, if the entry engine can take its replies back; nothing, if it keeps no
    conversation; None (a restart ends the conversation) if it keeps one it cannot
    rebuild."""
    limit = spec.inputs.max_history_bytes
    if REPLY_FIELD in takes:
        return ConversationLog(limit)
    if TURN_FIELD not in takes:
        return ConversationLog(limit, records=False)
    return None
