"""``ResponseStream``: one realtime response, from ``response.created`` to ``response.done``.

It turns the pipeline's events for one response (``TextDelta``, ``AudioDelta``,
``ResponseDone``) into the Realtime API's events (see
``omni_actors.protocols.realtime_server`` for their order), keeping the response's and
its item's ids, the transcript so far and the audio sent. A cancelled response's
deltas never reach it: once ``Response.cancel`` is called, the session hands out none
(the one filter, in ``Session.next_event``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypedDict

import torch

from omni_actors.pipeline.response import Response
from omni_actors.protocols.events import ResponseDone as PipelineResponseDone
from omni_actors.protocols.realtime_server import (
    ConversationItem,
    ErrorDetail,
    ItemContent,
    RealtimeResponse,
    ResponseAudio,
    ResponseAudioOutput,
    ResponseContentPartAdded,
    ResponseContentPartDone,
    ResponseCreated,
    ResponseDone,
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
from omni_actors.server.usage import TokenUsage, token_usage

__all__ = ["CancelReason", "ResponseStream"]

CancelReason = Literal["turn_detected", "client_cancelled"]


class _Where(TypedDict):
    """The fields that place a delta: its response, item and content part."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int


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
        entry_stage: the pipeline's entry stage, whose report counts the tokens.
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
        entry_stage: str = "",
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
        self._entry_stage = entry_stage
        self._usage = TokenUsage(prompt=0, completion=0)

    @property
    def audio_ms(self) -> float:
        """Milliseconds of audio sent to the client."""
        return 1000.0 * self.audio_samples / self._rate

    def _part(self) -> ItemContent:
        text = "".join(self.text)
        if self.audio_out:
            return ItemContent(type="audio", transcript=text)
        return ItemContent(type="text", text=text)

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
            output=[self._item("completed" if status == "completed" else "incomplete")]
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
        """A text delta."""
        if self.ended or not text:
            return []
        self.text.append(text)
        if self.audio_out:
            return [
                ResponseOutputAudioTranscriptDelta(
                    event_id=self._event_id(), delta=text, **self._where()
                )
            ]
        return [ResponseOutputTextDelta(event_id=self._event_id(), delta=text, **self._where())]

    def on_audio(self, samples: torch.Tensor) -> list[ServerEvent]:
        """An audio delta (dropped in text-only responses)."""
        if self._encoder is None or self.ended:
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
        self.ended = True
        metrics = event.metrics if event is not None else None
        self._usage = token_usage(metrics, self._entry_stage, len(self.text))
        events: list[ServerEvent] = []
        if event is not None and event.status == "completed" and self.cancel_reason is None:
            status: Literal["completed", "cancelled", "failed"] = "completed"
            details = None
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
            ResponseDone(event_id=self._event_id(), response=self._describe(status, details)),
        ]
        return events


def _samples_in(data: str, output_format: str) -> int:
    """Samples in a base64 payload of ``output_format`` (2 bytes each for PCM16)."""
    size = len(data) * 3 // 4 - data.count("=", -2)
    return size // 2 if output_format == "audio/pcm" else size
