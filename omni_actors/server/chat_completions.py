"""``POST /v1/chat/completions``: OpenAI's chat completions over a conversation session.

A request is checked first (``chat_request.py``: nothing is started for a bad one),
then served by one resumable :class:`~omni_actors.pipeline.session.Session`: the system
messages go to the entry stage's ``instructions`` field, each user message is sent and
committed as a turn, each assistant message is added as an earlier reply
(``Session.add_reply``), and ``respond`` starts the reply, whose events become the
completion — one ``chat.completion`` JSON body, or with ``stream: true`` server-sent
``chat.completion.chunk`` events (text in ``delta.content``; with audio, base64 PCM16
and the transcript in ``delta.audio`` pieces, as OpenAI streams them). A text reply
that meets one of the request's ``stop`` strings ends before it: the text up to it is
sent (``stop_text.py``) and the reply is cancelled on every stage.

With tools, the tools go to the entry stage's ``tools`` field, an assistant message's
``tool_calls`` and ``tool`` messages as the entry stage takes them back, and the
reply's text is read for calls (:class:`~omni_actors.server.tools.ToolCallReader`):
each call the model makes is one of the reply's ``tool_calls``, and the reply ends with
``finish_reason: "tool_calls"``. Streamed, a call goes out as the model writes it, as
OpenAI streams one: a ``delta.tool_calls`` piece with its ``id``, ``type`` and name once
the name is written, then pieces of its ``function.arguments`` text. A malformed call
fails the reply (``invalid_tool_call``): before any byte of the body when the reply is
not streamed; streamed, after whatever of the call had gone out (a function not offered
is refused before anything of its call does; broken JSON, or a call never closed, only
shows once its start and part of its arguments were sent), as the stream's last event,
an error, before ``[DONE]``.

The session is closed on every way out, and a client that goes away mid-reply aborts
it on every stage at once: the reply runs in a task of its own, beside one that waits
for the client's disconnect, and whichever ends first cancels the other.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD, TOOLS_FIELD
from omni_actors.actors.engines.tool_calls import MalformedToolCallError
from omni_actors.audio.wav import encode_wav
from omni_actors.errors import OmniError
from omni_actors.pipeline.response import Response as PipelineResponse
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.session_input import SessionClosedError
from omni_actors.protocols.chat_completions import (
    AssistantReply,
    ChatAudio,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    DeltaAudio,
    FinishReason,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from omni_actors.protocols.events import (
    Aborted,
    AudioDelta,
    Event,
    ResponseDone,
    SessionError,
    TextDelta,
)
from omni_actors.server.audio_format import OutputAudio
from omni_actors.server.auth import authorized
from omni_actors.server.chat_request import (
    OUTPUT_RATE,
    ChatPlan,
    ChatRequestError,
    ReplyTurn,
    plan_request,
)
from omni_actors.server.http_error import error_body, error_response
from omni_actors.server.model_list import served_name
from omni_actors.server.state import ServerState, server_state
from omni_actors.server.stop_text import StopText
from omni_actors.server.tools import (
    CallArguments,
    CallStarted,
    ReplyPiece,
    ToolCallReader,
    new_call_id,
)
from omni_actors.server.usage import token_usage

__all__ = ["AUDIO_LIFETIME_S", "ChatCompletionReply", "ReplyFailedError", "chat_completions"]

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()

AUDIO_LIFETIME_S = 24 * 3600
"""A reply's audio ``expires_at`` is this long after its ``created``, as OpenAI's."""
_JSON = [(b"content-type", b"application/json")]
_SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # a reverse proxy must pass each event on at once
]


class ReplyFailedError(OmniError):
    """The pipeline could not produce the reply (the session failed or ended).

    Attributes:
        status: the HTTP status (500; 503 when the pipeline had no room).
        error_code: the pipeline's error code (``timeout``, ``stage_failed``, ...).
    """

    def __init__(self, message: str, *, status: int = 500, error_code: str = "internal") -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions`` (see the module docstring)."""
    state = server_state(request)
    settings = state.settings
    try:
        if not authorized(settings, request.headers, ()):
            raise ChatRequestError(
                "missing or wrong API key: send it as 'Authorization: Bearer KEY'",
                status=401,
                error_code="invalid_api_key",
            )
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > settings.max_message_bytes:
                raise ChatRequestError(
                    f"the request is over {settings.max_message_bytes} bytes "
                    "(max_message_bytes): send shorter audio",
                    status=413,
                    error_code="request_too_large",
                )
        spec = state.pipeline.spec
        plan = plan_request(
            bytes(body),
            spec,
            model=served_name(state),
            max_bytes=settings.max_append_bytes,
            voices=await state.voices(),
        )
    except ChatRequestError as exc:
        log.info("chat completion refused (%s): %s", exc.error_code, exc)
        state.metrics.error(exc.error_code)
        state.metrics.chat_completion(exc.error_code)
        return error_response(str(exc), exc.status, exc.error_code, exc.param)
    return ChatCompletionReply(state, plan)


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone away (the request's body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ChatCompletionReply(Response):
    """The reply to one checked request: runs its session as the response is sent.

    Args:
        state: the server's state (its pipeline, slots and metrics).
        plan: the checked request.
    """

    def __init__(self, state: ServerState, plan: ChatPlan) -> None:
        super().__init__()
        self.state = state
        self.plan = plan
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.audio_id = f"audio_{uuid.uuid4().hex[:24]}"
        self._send: Send | None = None
        self._streaming = False  # the SSE headers are out: errors go in the stream
        self._complete = False  # the last byte of the reply is out
        self._text: list[str] = []  # the reply's text as handed out
        self._tokens = 0  # its text deltas: one per token
        self._stop = StopText(plan.stop)
        self._done: ResponseDone | None = None
        self._said: list[str] = []  # the reply's text outside its tool calls
        self._calls: list[ToolCall] = []  # the calls it made, once each is checked
        self._call_ids: list[str] = []  # the calls it started, each call's id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer, unless the client goes away first (which aborts the session)."""
        self._send = send
        answer = asyncio.create_task(self._answer(), name=f"chat {self.id}")
        gone = asyncio.create_task(_disconnected(receive), name=f"chat {self.id} client")
        left = False
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
            # Once the reply is sent, the server reports a disconnect at once: the
            # answer then only closes its session, which must not be interrupted.
            if not answer.done() and not self._complete:
                left = True
                answer.cancel()
        except BaseException:
            answer.cancel()  # the server is stopping this request
            raise
        finally:
            gone.cancel()
            result, _ = await asyncio.gather(answer, gone, return_exceptions=True)
        if left:
            log.info("chat %s: the client went away; its session was aborted", self.id)
            self.state.metrics.chat_completion("cancelled")
        elif isinstance(result, BaseException):
            log.error("chat %s failed: %r", self.id, result, exc_info=result)

    # -- the reply ---------------------------------------------------------------------

    async def _answer(self) -> None:
        state = self.state
        if not state.admit():
            reason = "the server is shutting down" if state.draining else "the server is full"
            await self._fail(
                ReplyFailedError(
                    f"{reason} ({state.max_sessions} sessions at most: max_sessions); retry later",
                    status=503,
                    error_code="busy",
                )
            )
            return
        state.chats += 1
        try:
            await self._serve()
        finally:
            state.chats -= 1
            state.release()
            state.response_ended.set()

    async def _serve(self) -> None:
        plan = self.plan
        session = self.state.pipeline.session(modalities=plan.modalities, session_id=self.id)
        try:
            error = await session.open()
            if error is not None:
                raise ReplyFailedError(
                    error.message,
                    status=503 if error.code == "admission" else 500,
                    error_code=error.code,
                )
            response = await self._start(session)
            if plan.stream:
                await self._stream(response)
            else:
                await self._reply(response)
        except ReplyFailedError as exc:
            await self._fail(exc)
        finally:
            await session.close()

    async def _start(self, session: Session) -> PipelineResponse:
        """Send the instructions and the turns; start the reply."""
        plan = self.plan
        try:
            setting: dict[str, str] = {}  # sent together: one system turn holds both
            if plan.instructions:
                setting[INSTRUCTIONS_FIELD] = plan.instructions
            if plan.tools is not None and plan.tool_names:
                setting[TOOLS_FIELD] = plan.tools
            if setting:
                await session.send(fields=setting)
            for turn in plan.turns:
                if isinstance(turn, ReplyTurn):
                    await session.add_reply(turn.text, tool_calls=turn.tool_calls)
                    continue
                for part in turn:
                    await session.send(
                        text=part.text,
                        audio=part.audio,
                        sample_rate=part.sample_rate,
                        fields=part.fields(),
                    )
                await session.commit()
            options = plan.options
            return await session.respond(
                max_tokens=options.max_tokens,
                temperature=options.temperature,
                voice=options.voice,
            )
        except SessionClosedError:
            raise _ended(session.channel.terminal) from None
        except OmniError as exc:
            raise ReplyFailedError(str(exc), error_code=exc.code) from None

    async def _pieces(
        self, response: PipelineResponse
    ) -> AsyncIterator[TextDelta | str | ToolCallDelta]:
        """The reply's said text deltas, base64 PCM16 pieces (24 kHz) and pieces of its
        tool calls as they stream, until it completes (the checked calls are then in
        ``_calls``).

        Raises:
            ReplyFailedError: the reply failed, or the session ended first.
        """
        names = self.plan.tool_names
        reader = ToolCallReader(names) if names is not None else None
        async for piece in self._events(response):
            if reader is None or not isinstance(piece, TextDelta):
                if isinstance(piece, TextDelta):
                    self._said.append(piece.text)
                yield piece
                continue
            for read in _read(reader.feed, piece.text):
                if (told := self._told(read, piece)) is not None:
                    yield told
        if reader is not None:
            for read in _read(reader.finish):
                if (told := self._told(read, None)) is not None:
                    yield told

    def _told(self, piece: ReplyPiece, delta: TextDelta | None) -> TextDelta | ToolCallDelta | None:
        """What ``piece`` of the reply tells the client (None: a call's end, kept)."""
        if isinstance(piece, str):
            self._said.append(piece)
            if delta is None:
                return TextDelta(session=self.id, text=piece)
            return msgspec.structs.replace(delta, text=piece)
        if isinstance(piece, CallStarted):
            self._call_ids.append(new_call_id())
            return ToolCallDelta(
                index=len(self._call_ids) - 1,
                id=self._call_ids[-1],
                type="function",
                function=FunctionCallDelta(name=piece.name, arguments=""),
            )
        if isinstance(piece, CallArguments):
            return ToolCallDelta(
                index=len(self._call_ids) - 1,
                function=FunctionCallDelta(arguments=piece.delta),
            )
        self._calls.append(
            ToolCall(
                id=self._call_ids[-1],
                function=FunctionCall(name=piece.name, arguments=piece.arguments),
            )
        )
        return None

    async def _events(self, response: PipelineResponse) -> AsyncIterator[TextDelta | str]:
        """The reply's text deltas and base64 PCM16 pieces (24 kHz), until it completes.

        Raises:
            ReplyFailedError: the reply failed, or the session ended first.
        """
        audio = (
            OutputAudio(self.state.pipeline.spec.outputs.sample_rate, "audio/pcm")
            if self.plan.audio_format is not None
            else None
        )
        async for event in response.events():
            if isinstance(event, TextDelta):
                if self._stop.stopped:
                    continue  # cancelled: the deltas already sent are all there is
                self._tokens += 1
                text = self._stop.feed(event.text)
                if self._stop.stopped:
                    await response.cancel()  # a stop string: no more of the reply
                if text:
                    self._text.append(text)
                    yield event if text == event.text else msgspec.structs.replace(event, text=text)
            elif isinstance(event, AudioDelta):
                data = audio.encode(event.audio) if audio is not None else ""
                if data:
                    yield data
            elif isinstance(event, ResponseDone):
                self._ended_with(event)
            else:
                raise _ended(event)
        if audio is not None and (tail := audio.flush()):
            yield tail
        if held := self._stop.flush():
            self._text.append(held)
            yield TextDelta(session=response.session.id, text=held, response=response.id)

    def _ended_with(self, done: ResponseDone) -> None:
        """Record how the reply ended; raise unless it completed."""
        self._done = done
        metrics = self.state.metrics
        metrics.response_done(done.status, done.metrics)
        if done.status != "completed" and not (self._stop.stopped and done.status == "cancelled"):
            raise ReplyFailedError(
                done.message or f"the reply ended {done.status}",
                error_code=done.code or "internal",
            )

    def _finish_reason(self) -> FinishReason:
        """``tool_calls`` when the reply called a tool; ``length`` when it was cut at
        the most tokens it was allowed and met no stop string, else ``stop``.

        The entry stage says whether its reply was cut (its report's
        ``finish_reason``: the request's ``max_tokens`` or the engine's own cap, a
        preset's ``max_new_tokens``); from an engine that does not tell, a reply with
        as many text deltas (one per token) as the request allowed was cut."""
        if self._calls:
            return "tool_calls"
        if self._stop.stopped:
            return "stop"
        done = self._done
        report = (
            None if done is None else done.metrics.stages.get(self.state.pipeline.spec.reply_stage)
        )
        if report is not None and report.finish_reason is not None:
            return report.finish_reason
        limit = self.plan.options.max_tokens
        return "length" if limit is not None and self._tokens >= limit else "stop"

    def _usage(self) -> Usage:
        done = self._done
        writer = self.state.pipeline.spec.reply_stage
        usage = token_usage(done.metrics if done is not None else None, writer, self._tokens)
        return Usage(
            prompt_tokens=usage.prompt,
            completion_tokens=usage.completion,
            total_tokens=usage.total,
        )

    async def _reply(self, response: PipelineResponse) -> None:
        """One ``chat.completion`` body."""
        pcm = bytearray()
        async for piece in self._pieces(response):
            if isinstance(piece, str):
                pcm += base64.b64decode(piece)
        transcript = "".join(self._said)
        calls = self._calls or None
        if self.plan.audio_format is None:
            message = AssistantReply(content=transcript or None if calls else transcript)
        else:
            data = bytes(pcm)
            if self.plan.audio_format == "wav":
                data = encode_wav(data, OUTPUT_RATE)
            audio = ChatAudio(
                id=self.audio_id,
                data=base64.b64encode(data).decode("ascii"),
                expires_at=self.created + AUDIO_LIFETIME_S,
                transcript=transcript,
            )
            message = AssistantReply(content=None, audio=audio)
        if calls:
            message = msgspec.structs.replace(message, tool_calls=calls)
        completion = ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.plan.model,
            choices=[Choice(message=message, finish_reason=self._finish_reason())],
            usage=self._usage(),
        )
        await self._respond(200, _encoder.encode(completion))
        self.state.metrics.chat_completion("completed")

    async def _stream(self, response: PipelineResponse) -> None:
        """Server-sent ``chat.completion.chunk`` events, then ``[DONE]``."""
        send = self._sender()
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        self._streaming = True
        await self._chunk(Delta(role="assistant"))
        voiced = self.plan.audio_format is not None
        async for piece in self._pieces(response):
            if isinstance(piece, ToolCallDelta):
                await self._chunk(Delta(tool_calls=[piece]))
            elif isinstance(piece, str):
                await self._chunk(Delta(audio=DeltaAudio(id=self.audio_id, data=piece)))
            elif voiced:
                delta = DeltaAudio(id=self.audio_id, transcript=piece.text)
                await self._chunk(Delta(audio=delta))
            else:
                await self._chunk(Delta(content=piece.text))
        if voiced:
            expiry = DeltaAudio(id=self.audio_id, expires_at=self.created + AUDIO_LIFETIME_S)
            await self._chunk(Delta(audio=expiry))
        await self._chunk(Delta(), finish_reason=self._finish_reason())
        if self.plan.include_usage:
            await self._event(self._completion_chunk([], usage=self._usage()))
        await self._last(b"data: [DONE]\n\n")
        self.state.metrics.chat_completion("completed")

    # -- sending -----------------------------------------------------------------------

    def _sender(self) -> Send:
        assert self._send is not None, "the reply is sent by __call__"
        return self._send

    def _completion_chunk(
        self, choices: list[ChunkChoice], usage: Usage | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.plan.model, choices=choices, usage=usage
        )

    async def _chunk(self, delta: Delta, finish_reason: FinishReason | None = None) -> None:
        choice = ChunkChoice(delta=delta, finish_reason=finish_reason)
        await self._event(self._completion_chunk([choice]))

    async def _event(self, payload: msgspec.Struct) -> None:
        body = b"data: " + _encoder.encode(payload) + b"\n\n"
        await self._sender()({"type": "http.response.body", "body": body, "more_body": True})

    async def _respond(self, status: int, body: bytes) -> None:
        await self._sender()({"type": "http.response.start", "status": status, "headers": _JSON})
        await self._last(body)

    async def _last(self, body: bytes) -> None:
        """Send the reply's last bytes."""
        await self._sender()({"type": "http.response.body", "body": body})
        self._complete = True

    async def _fail(self, error: ReplyFailedError) -> None:
        """Tell the client: an error body, or, once streaming, a last error event."""
        log.warning("chat %s failed (%s): %s", self.id, error.error_code, error)
        metrics = self.state.metrics
        metrics.error(error.error_code)
        metrics.chat_completion("failed" if error.error_code != "busy" else "busy")
        body = error_body(str(error), error.status, error.error_code)
        if not self._streaming:
            await self._respond(error.status, _encoder.encode(body))
            return
        await self._event(body)
        await self._last(b"data: [DONE]\n\n")


def _read(step: Callable[..., list[ReplyPiece]], *args: str) -> list[ReplyPiece]:
    """``step(*args)`` of a :class:`ToolCallReader`; a malformed call fails the reply."""
    try:
        return step(*args)
    except MalformedToolCallError as exc:
        raise ReplyFailedError(str(exc), error_code="invalid_tool_call") from None


def _ended(event: Event | None) -> ReplyFailedError:
    """The error for a session that ended before its reply did."""
    if isinstance(event, SessionError):
        return ReplyFailedError(event.message, error_code=event.code)
    if isinstance(event, Aborted):
        return ReplyFailedError(f"the session was aborted: {event.reason}", error_code="aborted")
    return ReplyFailedError("the session ended before the reply", error_code="internal")
