"""``ResponseStream``: one realtime response, from ``response.created`` to ``response.done``.

It turns the pipeline's events for one response (``TextDelta``, ``AudioDelta``,
``ResponseDone``) into the Realtime API's events (see
``omni_actors.protocols.realtime_server`` for their order), keeping the response's and
its item's ids, the transcript so far and the audio sent. A cancelled response's
deltas never reach the client: once ``Response.cancel`` is called, the session hands out
none (``Session.next_event``), and once the client's cancel is taken (``cancel_reason``,
set before the pipeline has started the response, too) this sends none.

With tools offered, the reply's text is read for tool calls
(:class:`~omni_actors.server.tools.ToolCallReader`): the transcript is what it says,
and each call it makes becomes a ``function_call`` item of the response, after its
message item, streamed as the model writes it: ``response.output_item.added`` once its
function's name is written, ``response.function_call_arguments.delta`` for each piece
of its arguments, then ``.done`` with the whole arguments and the item's ``done``.

A malformed call raises from :meth:`on_text` (or fails the response in :meth:`done`);
the connection then fails the response (:meth:`fail`), which sends nothing more of it.
A call of a function not offered fails before anything of it is sent. One that turns
out malformed once it streamed (its JSON broken, or never closed) leaves the client
with its ``output_item.added`` and ``conversation.item.added`` and the argument deltas
sent so far, never their ``.done``: the call ends ``incomplete`` (its
``output_item.done``, and in ``response.done``'s output), in a ``failed`` response.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, TypedDict

import torch

from omni_actors.actors.engines.tool_calls import MalformedToolCallError, ToolCall
from omni_actors.pipeline.response import Response
from omni_actors.protocols.events import ResponseDone as PipelineResponseDone
from omni_actors.protocols.realtime_server import (
    ConversationItem,
    ConversationItemAdded,
    ConversationItemDone,
    ErrorDetail,
    FunctionCallItem,
    ItemContent,
    RealtimeResponse,
    ResponseAudio,
    ResponseAudioOutput,
    ResponseContentPartAdded,
    ResponseContentPartDone,
    ResponseCreated,
    ResponseDone,
    ResponseFunctionCallArgumentsDelta,
    ResponseFunctionCallArgumentsDone,
    ResponseOutputAudioDelta,
    ResponseOutputAudioDone,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputAudioTranscriptDone,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
    ResponseOutputTextDelta,
    ResponseOutputTextDone,
    ResponseStatusDetails,
    ServerEvent,
    Usage,
)
from omni_actors.server.audio_format import OutputAudio, format_rate
from omni_actors.server.session_config import ResponseSettings, describe_format
from omni_actors.server.tools import (
    CallArguments,
    CallStarted,
    ReplyPiece,
    ToolCallReader,
    new_call_id,
)
from omni_actors.server.usage import TokenUsage, token_usage

__all__ = ["CancelReason", "ResponseStream", "tool_call_error"]

CancelReason = Literal["turn_detected", "client_cancelled"]


class _Where(TypedDict):
    """The fields that place a delta: its response, item and content part."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int


class _CallPlace(TypedDict):
    """The fields that place a function call's arguments event."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str


class ResponseStream:
    """One response's Realtime events (see the module docstring).

    Args:
        response_id: the response's id (``resp_…``), the pipeline's response id too.
        item_id: its assistant item's id.
        settings: what the response was asked for.
        source_rate: the pipeline's output sample rate.
        event_id: makes a new ``event_id``.
        conversation_id: the session's conversation (None: an out-of-band response).
        metadata: ``response.create``'s metadata, echoed back.
        tools: the names of the tools offered, when the pipeline takes tools (its reply
            is then read for calls); None when it takes none.
        item_ids: makes a new item's id (for the function calls).
        reply_stage: the stage that writes the reply (``PipelineSpec.reply_stage``), whose
            report counts the tokens and says whether the reply was cut at its most.
    """

    def __init__(
        self,
        response_id: str,
        item_id: str,
        settings: ResponseSettings,
        *,
        source_rate: int,
        event_id: Callable[[], str],
        conversation_id: str | None,
        metadata: dict[str, str] | None = None,
        tools: Iterable[str] | None = None,
        item_ids: Callable[[], str] | None = None,
        reply_stage: str = "",
    ) -> None:
        self.id = response_id
        self.item_id = item_id
        self.settings = settings
        self.audio_out = "audio" in settings.modalities
        self._event_id = event_id
        self._conversation_id = conversation_id
        self._metadata = metadata
        self._encoder = OutputAudio(source_rate, settings.output_format) if self.audio_out else None
        self._rate = format_rate(settings.output_format)
        self.text: list[str] = []
        self.audio_samples = 0  # samples sent, at the output format's rate
        self.response: Response | None = None  # once the pipeline has started it
        self.cancel_reason: CancelReason | None = None
        self.ended = False
        self.reader = ToolCallReader(tools) if tools is not None else None
        self._item_ids = item_ids or (lambda: f"item_{new_call_id()[5:]}")
        self.calls: list[FunctionCallItem] = []  # completed, in order
        self._open: FunctionCallItem | None = None  # the call being written, if any
        self._arguments: list[str] = []  # its arguments so far
        self.failure: ErrorDetail | None = None  # set by ``fail``: it ends failed
        self._reply_stage = reply_stage
        self._usage = TokenUsage(prompt=0, completion=0)
        self._tokens = 0  # the reply's text deltas, tool calls' included

    @property
    def audio_ms(self) -> float:
        """Milliseconds of audio sent to the client."""
        return 1000.0 * self.audio_samples / self._rate

    def _part(self) -> ItemContent:
        text = "".join(self.text)
        if self.audio_out:
            return ItemContent(type="audio", transcript=text)
        return ItemContent(type="text", text=text)

    @property
    def usage(self) -> TokenUsage:
        """The response's tokens, as its entry engine counted them (zero until done)."""
        return self._usage

    def _item(self, status: Literal["completed", "incomplete", "in_progress"]) -> ConversationItem:
        text = "".join(self.text)
        content = (
            ItemContent(type="output_audio", transcript=text)
            if self.audio_out
            else ItemContent(type="output_text", text=text)
        )
        return ConversationItem(
            id=self.item_id,
            role="assistant",
            status=status,
            content=[] if status == "in_progress" else [content],
        )

    def _describe(
        self,
        status: Literal["completed", "cancelled", "failed", "incomplete", "in_progress"],
        details: ResponseStatusDetails | None = None,
    ) -> RealtimeResponse:
        final = status != "in_progress"
        return RealtimeResponse(
            id=self.id,
            status=status,
            status_details=details,
            output=[
                self._item("completed" if status == "completed" else "incomplete"),
                *self.calls,
                *self._unfinished(),
            ]
            if final
            else [],
            output_modalities=list(self.settings.modalities),
            max_output_tokens="inf"
            if self.settings.max_tokens is None
            else self.settings.max_tokens,
            audio=ResponseAudio(
                output=ResponseAudioOutput(
                    format=describe_format(self.settings.output_format),
                    voice=self.settings.voice,
                )
            ),
            conversation_id=self._conversation_id,
            usage=Usage(
                total_tokens=self._usage.total,
                input_tokens=self._usage.prompt,
                output_tokens=self._usage.completion,
            )
            if final
            else None,
            metadata=self._metadata,
        )

    def opening(self) -> list[ServerEvent]:
        """``response.created``, the item and its content part."""
        part = (
            ItemContent(type="audio", transcript="")
            if self.audio_out
            else ItemContent(type="text", text="")
        )
        return [
            ResponseCreated(event_id=self._event_id(), response=self._describe("in_progress")),
            ResponseOutputItemAdded(
                event_id=self._event_id(),
                response_id=self.id,
                output_index=0,
                item=self._item("in_progress"),
            ),
            ResponseContentPartAdded(
                event_id=self._event_id(),
                response_id=self.id,
                item_id=self.item_id,
                output_index=0,
                content_index=0,
                part=part,
            ),
        ]

    def _where(self) -> _Where:
        return _Where(response_id=self.id, item_id=self.item_id, output_index=0, content_index=0)

    def on_text(self, text: str) -> list[ServerEvent]:
        """A text delta: what it says, and the tool calls it completes.

        Raises:
            MalformedToolCallError: it closed a tool call that cannot be made.
        """
        if self.ended or self.failure is not None or self.cancel_reason is not None or not text:
            return []
        self._tokens += 1  # one text delta is one token
        if self.reader is None:
            return self._said(text)
        return self._read(self.reader.feed(text))

    def _read(self, pieces: Iterable[ReplyPiece]) -> list[ServerEvent]:
        events: list[ServerEvent] = []
        for piece in pieces:
            if isinstance(piece, str):
                events += self._said(piece)
            elif isinstance(piece, CallStarted):
                events += self._call_started(piece.name)
            elif isinstance(piece, CallArguments):
                events.append(self._call_arguments(piece.delta))
            else:
                events += self._called(piece)
        return events

    def fail(self, error: ErrorDetail) -> None:
        """Fail the response with ``error``: nothing more of it is sent, and it ends
        ``failed`` (the caller stops it in the pipeline)."""
        if self.failure is None:
            self.failure = error

    @property
    def last_item_id(self) -> str:
        """The id of the response's last item (its message, or its last call)."""
        return self.calls[-1].id if self.calls else self.item_id

    def _place(self, item: FunctionCallItem) -> _CallPlace:
        return _CallPlace(
            response_id=self.id,
            item_id=item.id,
            output_index=1 + len(self.calls),  # after the message item and earlier calls
            call_id=item.call_id,
        )

    def _call_started(self, name: str) -> list[ServerEvent]:
        """A function call item is added, its arguments to come."""
        item = FunctionCallItem(
            id=self._item_ids(),
            call_id=new_call_id(),
            name=name,
            arguments="",
            status="in_progress",
        )
        self._open, self._arguments = item, []
        index = self._place(item)["output_index"]
        return [
            ResponseOutputItemAdded(
                event_id=self._event_id(), response_id=self.id, output_index=index, item=item
            ),
            ConversationItemAdded(
                event_id=self._event_id(), item=item, previous_item_id=self.last_item_id
            ),
        ]

    def _call_arguments(self, delta: str) -> ServerEvent:
        """A piece of the open call's arguments."""
        assert self._open is not None
        self._arguments.append(delta)
        return ResponseFunctionCallArgumentsDelta(
            event_id=self._event_id(), delta=delta, **self._place(self._open)
        )

    def _called(self, call: ToolCall) -> list[ServerEvent]:
        """The open call ended well: its arguments' ``done``, its item's ``done``."""
        item = self._open
        assert item is not None
        previous = self.last_item_id
        place = self._place(item)
        done = FunctionCallItem(
            id=item.id,
            call_id=item.call_id,
            name=call.name,
            arguments=call.arguments,
            status="completed",
        )
        self._open = None
        self.calls.append(done)
        return [
            ResponseFunctionCallArgumentsDone(
                event_id=self._event_id(), name=call.name, arguments=call.arguments, **place
            ),
            ResponseOutputItemDone(
                event_id=self._event_id(),
                response_id=self.id,
                output_index=place["output_index"],
                item=done,
            ),
            ConversationItemDone(event_id=self._event_id(), item=done, previous_item_id=previous),
        ]

    def _unfinished(self) -> list[FunctionCallItem]:
        """The call left open when the response ended (``incomplete``), if any."""
        item = self._open
        if item is None:
            return []
        return [
            FunctionCallItem(
                id=item.id,
                call_id=item.call_id,
                name=item.name,
                arguments="".join(self._arguments),
                status="incomplete",
            )
        ]

    def _said(self, text: str) -> list[ServerEvent]:
        if not text:
            return []
        self.text.append(text)
        if self.audio_out:
            return [
                ResponseOutputAudioTranscriptDelta(
                    event_id=self._event_id(), delta=text, **self._where()
                )
            ]
        return [ResponseOutputTextDelta(event_id=self._event_id(), delta=text, **self._where())]

    @property
    def speaking(self) -> bool:
        """Whether its audio reaches the client: an audio response, not ended, failed
        or cancelled."""
        return not (
            self._encoder is None
            or self.ended
            or self.failure is not None
            or self.cancel_reason is not None
        )

    def on_audio(self, samples: torch.Tensor) -> list[ServerEvent]:
        """An audio delta (dropped in text-only responses)."""
        if self._encoder is None or not self.speaking:
            return []
        return self._audio_delta(self._encoder.encode(samples))

    def _audio_delta(self, data: str) -> list[ServerEvent]:
        if not data:
            return []
        self.audio_samples += _samples_in(data, self.settings.output_format)
        return [ResponseOutputAudioDelta(event_id=self._event_id(), delta=data, **self._where())]

    def done(
        self, event: PipelineResponseDone | None, error: ErrorDetail | None = None
    ) -> list[ServerEvent]:
        """The closing events: from the pipeline's ``ResponseDone``, or (``event`` None)
        a failure with ``error`` (the session ended, or the pipeline refused it)."""
        if self.ended:
            return []
        metrics = event.metrics if event is not None else None
        self._usage = token_usage(metrics, self._reply_stage, self._tokens)
        events: list[ServerEvent] = []
        completed = event is not None and event.status == "completed"
        if completed and self.reader is not None and self.failure is None:
            try:
                events += self._read(self.reader.finish())
            except MalformedToolCallError as exc:
                self.fail(tool_call_error(exc))
        self.ended = True
        if self.failure is not None:
            events = []
            status: Literal["completed", "incomplete", "cancelled", "failed"] = "failed"
            details: ResponseStatusDetails | None = ResponseStatusDetails(
                type="failed", error=self.failure
            )
        elif completed and self.cancel_reason is None:
            status = "completed"
            details = None
            if _cut_at_max_tokens(event, self._reply_stage):
                # As OpenAI ends a reply cut at max_output_tokens.
                status = "incomplete"
                details = ResponseStatusDetails(type="incomplete", reason="max_output_tokens")
            if self._encoder is not None:
                events += self._audio_delta(self._encoder.flush())
        elif (event is None or event.status == "failed") and self.cancel_reason is None:
            status = "failed"
            if error is None:
                assert event is not None
                error = ErrorDetail(
                    type="server_error",
                    code=event.code,
                    message=event.message or "the response failed",
                )
            details = ResponseStatusDetails(type="failed", error=error)
        else:
            status = "cancelled"
            details = ResponseStatusDetails(
                type="cancelled", reason=self.cancel_reason or "client_cancelled"
            )
        where = self._where()
        transcript = "".join(self.text)
        if self.audio_out:
            events.append(ResponseOutputAudioDone(event_id=self._event_id(), **where))
            events.append(
                ResponseOutputAudioTranscriptDone(
                    event_id=self._event_id(), transcript=transcript, **where
                )
            )
        else:
            events.append(
                ResponseOutputTextDone(event_id=self._event_id(), text=transcript, **where)
            )
        item_status: Literal["completed", "incomplete"] = (
            "completed" if status == "completed" else "incomplete"
        )
        events += [
            ResponseContentPartDone(event_id=self._event_id(), part=self._part(), **where),
            ResponseOutputItemDone(
                event_id=self._event_id(),
                response_id=self.id,
                output_index=0,
                item=self._item(item_status),
            ),
            *(
                ResponseOutputItemDone(
                    event_id=self._event_id(),
                    response_id=self.id,
                    output_index=1 + len(self.calls),
                    item=call,
                )
                for call in self._unfinished()
            ),
            ResponseDone(event_id=self._event_id(), response=self._describe(status, details)),
        ]
        return events


def _cut_at_max_tokens(event: PipelineResponseDone | None, reply_stage: str) -> bool:
    """Whether the stage that writes the reply reports it cut at its most tokens."""
    report = None if event is None else event.metrics.stages.get(reply_stage)
    return report is not None and report.finish_reason == "length"


def tool_call_error(error: MalformedToolCallError) -> ErrorDetail:
    """The error a response fails with when its model wrote a malformed tool call."""
    return ErrorDetail(type="server_error", code="invalid_tool_call", message=str(error))


def _samples_in(data: str, output_format: str) -> int:
    """Samples in a base64 payload of ``output_format`` (2 bytes each for PCM16)."""
    size = len(data) * 3 // 4 - data.count("=", -2)
    return size // 2 if output_format == "audio/pcm" else size
