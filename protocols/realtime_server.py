"""Server → client events of the OpenAI Realtime API (GA names and shapes).

Every event has an ``event_id`` of its own; a response's ``response_id`` and its
assistant item's ``item_id`` stay the same across all the events of that response. A
response's events come in this order::

    response.created
    response.output_item.added        (the assistant message item, in_progress)
    response.content_part.added       (audio with its transcript, or text)
    response.output_audio.delta …     response.output_audio_transcript.delta …
      (or response.output_text.delta …)
    response.output_audio.done        response.output_audio_transcript.done
      (or response.output_text.done)
    response.content_part.done
    response.output_item.done
    response.done                     (completed | cancelled | incomplete | failed)
    rate_limits.updated

A response created with ``conversation: "none"`` (out of band) has the same events with
``conversation_id`` null: its item never joins the conversation.

A client of the beta API (handshake header ``OpenAI-Beta: realtime=v1``) gets the same
events under their beta names (:data:`BETA_NAMES`).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from omni_actors.protocols.realtime_client import AudioFormat, TokenLimits, TurnDetection

__all__ = [
    "BETA_NAMES",
    "ClientSecretCreated",
    "InputAudioBufferTimeoutTriggered",
    "OutputAudioBufferCleared",
    "OutputAudioBufferStarted",
    "OutputAudioBufferStopped",
    "TruncationState",
    "TurnDetectionState",
    "ConversationItem",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionToolState",
    "Item",
    "ResponseFunctionCallArgumentsDelta",
    "ResponseFunctionCallArgumentsDone",
    "ConversationItemAdded",
    "ConversationItemDeleted",
    "ConversationItemDone",
    "ConversationItemRetrieved",
    "ConversationItemTranscriptionCompleted",
    "ConversationItemTranscriptionDelta",
    "ConversationItemTranscriptionFailed",
    "ConversationItemTruncated",
    "ErrorDetail",
    "ErrorEvent",
    "InputAudioBufferCleared",
    "InputAudioBufferCommitted",
    "InputAudioBufferSpeechStarted",
    "InputAudioBufferSpeechStopped",
    "ItemContent",
    "RateLimit",
    "RateLimitsUpdated",
    "RealtimeResponse",
    "RealtimeSession",
    "ResponseContentPartAdded",
    "ResponseContentPartDone",
    "ResponseCreated",
    "ResponseDone",
    "ResponseOutputAudioDelta",
    "ResponseOutputAudioDone",
    "ResponseOutputAudioTranscriptDelta",
    "ResponseOutputAudioTranscriptDone",
    "ResponseOutputItemAdded",
    "ResponseOutputItemDone",
    "ResponseOutputTextDelta",
    "ResponseOutputTextDone",
    "ResponseStatusDetails",
    "ServerEvent",
    "SessionCreated",
    "SessionUpdated",
    "TranscriptionState",
    "TranscriptionUsage",
    "Usage",
]

Modality = Literal["text", "audio"]
ItemStatus = Literal["completed", "incomplete", "in_progress"]
ResponseStatus = Literal["completed", "cancelled", "failed", "incomplete", "in_progress"]


# -- objects -------------------------------------------------------------------------


class TranscriptionState(msgspec.Struct, frozen=True, kw_only=True):
    """``session.audio.input.transcription`` as it stands (null: off)."""

    model: str
    language: str | None = None
    prompt: str | None = None


class TurnDetectionState(TurnDetection, frozen=True, kw_only=True):
    """``turn_detection`` as it stands, and ``detector``, the model that runs it (not in
    OpenAI's schema; clients read past it): ``silero-vad``, ``frame-energy`` (Silero VAD
    not installed) or ``silero-vad+smart-turn-v3.2`` (``semantic_vad``)."""

    detector: str = ""


class AudioInputState(msgspec.Struct, frozen=True, kw_only=True):
    """``session.audio.input`` as it stands."""

    format: AudioFormat
    turn_detection: TurnDetectionState | None
    transcription: TranscriptionState | None = None
    noise_reduction: None = None


class AudioOutputState(msgspec.Struct, frozen=True, kw_only=True):
    """``session.audio.output`` as it stands."""

    format: AudioFormat
    voice: str | None
    speed: float = 1.0


class AudioState(msgspec.Struct, frozen=True, kw_only=True):
    """``session.audio``."""

    input: AudioInputState
    output: AudioOutputState


class FunctionToolState(msgspec.Struct, frozen=True, kw_only=True):
    """A tool of ``session.tools``, as the session holds it."""

    name: str
    description: str | None = None
    parameters: dict[str, object] | None = None
    type: Literal["function"] = "function"


class TruncationState(msgspec.Struct, frozen=True, kw_only=True):
    """``truncation`` as a retention ratio: past the limit, the oldest turns are dropped
    until this fraction of it is used."""

    retention_ratio: float
    type: Literal["retention_ratio"] = "retention_ratio"
    token_limits: TokenLimits | None = None


class RealtimeSession(msgspec.Struct, frozen=True, kw_only=True):
    """The session's settings, as ``session.created`` and ``session.updated`` show them."""

    id: str
    model: str
    output_modalities: list[Modality]
    instructions: str
    audio: AudioState
    max_output_tokens: int | Literal["inf"]
    expires_at: int
    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    tools: list[FunctionToolState] = []
    tool_choice: str = "auto"
    tracing: None = None
    truncation: str | TruncationState = "auto"
    prompt: None = None
    include: None = None


class ItemContent(msgspec.Struct, frozen=True, kw_only=True):
    """One content part: ``input_text``, ``input_audio``, ``output_text``,
    ``output_audio`` (with its ``transcript``), or a response part ``text``/``audio``."""

    type: str
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class ConversationItem(msgspec.Struct, frozen=True, kw_only=True):
    """A message item of the conversation (audio data is never echoed back)."""

    id: str
    role: Literal["user", "assistant", "system"]
    status: ItemStatus
    content: list[ItemContent]
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] = "realtime.item"


class FunctionCallItem(msgspec.Struct, frozen=True, kw_only=True):
    """A call of one of the session's tools, as the model made it: ``arguments`` is
    JSON text. The caller answers with a ``function_call_output`` item."""

    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus
    type: Literal["function_call"] = "function_call"
    object: Literal["realtime.item"] = "realtime.item"


class FunctionCallOutputItem(msgspec.Struct, frozen=True, kw_only=True):
    """A tool's result, given back for the call ``call_id``."""

    id: str
    call_id: str
    output: str
    status: ItemStatus = "completed"
    type: Literal["function_call_output"] = "function_call_output"
    object: Literal["realtime.item"] = "realtime.item"


Item = ConversationItem | FunctionCallItem | FunctionCallOutputItem
"""Any item of the conversation."""


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    """What went wrong: ``type`` (``invalid_request_error``, ``server_error``), ``code``,
    ``message``, the offending ``param`` and the client ``event_id`` that caused it."""

    type: str
    code: str | None
    message: str
    param: str | None = None
    event_id: str | None = None


class ResponseStatusDetails(msgspec.Struct, frozen=True, kw_only=True):
    """Why a response ended as it did (``reason`` for cancelled/incomplete ones)."""

    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: str | None = None
    error: ErrorDetail | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts of a response, as the entry engine counted them: input tokens are
    its context (the conversation so far), output tokens the text tokens it generated
    (the audio codec frames are not counted)."""

    total_tokens: int
    input_tokens: int
    output_tokens: int


class ResponseAudioOutput(msgspec.Struct, frozen=True, kw_only=True):
    """``response.audio.output``."""

    format: AudioFormat
    voice: str | None


class ResponseAudio(msgspec.Struct, frozen=True, kw_only=True):
    """``response.audio``."""

    output: ResponseAudioOutput


class RealtimeResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A response, as ``response.created`` and ``response.done`` show it."""

    id: str
    status: ResponseStatus
    output: list[Item]
    output_modalities: list[Modality]
    max_output_tokens: int | Literal["inf"]
    audio: ResponseAudio
    conversation_id: str | None
    status_details: ResponseStatusDetails | None = None
    usage: Usage | None = None
    metadata: dict[str, str] | None = None
    object: Literal["realtime.response"] = "realtime.response"


# -- events --------------------------------------------------------------------------


class _Event(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    event_id: str


class SessionCreated(_Event, tag="session.created", frozen=True, kw_only=True):
    """The first event of a connection: the session with its default settings."""

    session: RealtimeSession


class SessionUpdated(_Event, tag="session.updated", frozen=True, kw_only=True):
    """The answer to ``session.update``: the settings now in force."""

    session: RealtimeSession


class InputAudioBufferSpeechStarted(
    _Event, tag="input_audio_buffer.speech_started", frozen=True, kw_only=True
):
    """Server VAD heard speech begin (``audio_start_ms`` includes the prefix padding)."""

    audio_start_ms: int
    item_id: str


class InputAudioBufferTimeoutTriggered(
    _Event, tag="input_audio_buffer.timeout_triggered", frozen=True, kw_only=True
):
    """No speech for ``idle_timeout_ms`` after a reply ended: the silence between is
    committed and a response follows."""

    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class InputAudioBufferSpeechStopped(
    _Event, tag="input_audio_buffer.speech_stopped", frozen=True, kw_only=True
):
    """Server VAD heard speech end; a commit follows."""

    audio_end_ms: int
    item_id: str


class InputAudioBufferCommitted(
    _Event, tag="input_audio_buffer.committed", frozen=True, kw_only=True
):
    """The input buffer became user item ``item_id``."""

    item_id: str
    previous_item_id: str | None = None


class TranscriptionUsage(msgspec.Struct, frozen=True, kw_only=True):
    """What a transcription used: the seconds of audio it heard."""

    seconds: float
    type: Literal["duration"] = "duration"


class ConversationItemTranscriptionDelta(
    _Event, tag="conversation.item.input_audio_transcription.delta", frozen=True, kw_only=True
):
    """More of the transcript of user item ``item_id``'s audio (its part
    ``content_index``)."""

    item_id: str
    content_index: int = 0
    delta: str


class ConversationItemTranscriptionCompleted(
    _Event, tag="conversation.item.input_audio_transcription.completed", frozen=True, kw_only=True
):
    """The transcript of user item ``item_id``'s audio."""

    item_id: str
    content_index: int = 0
    transcript: str
    usage: TranscriptionUsage


class ConversationItemTranscriptionFailed(
    _Event, tag="conversation.item.input_audio_transcription.failed", frozen=True, kw_only=True
):
    """User item ``item_id``'s audio could not be transcribed (the conversation goes on)."""

    item_id: str
    content_index: int = 0
    error: ErrorDetail


class InputAudioBufferCleared(_Event, tag="input_audio_buffer.cleared", frozen=True, kw_only=True):
    """The input buffer was dropped."""


class ConversationItemAdded(_Event, tag="conversation.item.added", frozen=True, kw_only=True):
    """An item joined the conversation."""

    item: Item
    previous_item_id: str | None = None


class ConversationItemDone(_Event, tag="conversation.item.done", frozen=True, kw_only=True):
    """An item is complete."""

    item: Item
    previous_item_id: str | None = None


class ConversationItemTruncated(
    _Event, tag="conversation.item.truncated", frozen=True, kw_only=True
):
    """The assistant item was cut to ``audio_end_ms`` (the answer to a truncate)."""

    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemRetrieved(
    _Event, tag="conversation.item.retrieved", frozen=True, kw_only=True
):
    """The answer to ``conversation.item.retrieve``: the item as the server holds it."""

    item: Item


class ConversationItemDeleted(_Event, tag="conversation.item.deleted", frozen=True, kw_only=True):
    """The answer to ``conversation.item.delete``: no later response sees the item."""

    item_id: str


class RateLimit(msgspec.Struct, frozen=True, kw_only=True):
    """One limit: ``requests`` (the server's sessions: ``limit`` is ``max_sessions``,
    ``remaining`` the sessions it can still admit). The server counts no tokens against
    a budget, so it reports no ``tokens`` limit."""

    name: Literal["requests", "tokens"]
    limit: int
    remaining: int
    reset_seconds: float = 0.0


class OutputAudioBufferStarted(
    _Event, tag="output_audio_buffer.started", frozen=True, kw_only=True
):
    """A call's reply began playing on its audio track (WebRTC calls only)."""

    response_id: str


class OutputAudioBufferStopped(
    _Event, tag="output_audio_buffer.stopped", frozen=True, kw_only=True
):
    """A call's reply played to its end on its audio track (WebRTC calls only)."""

    response_id: str


class OutputAudioBufferCleared(
    _Event, tag="output_audio_buffer.cleared", frozen=True, kw_only=True
):
    """A call's reply stopped playing before its end: a barge-in or a cancel cut it
    (WebRTC calls only)."""

    response_id: str


class RateLimitsUpdated(_Event, tag="rate_limits.updated", frozen=True, kw_only=True):
    """The limits as they stand, sent after each ``response.done``."""

    rate_limits: list[RateLimit]


class ResponseCreated(_Event, tag="response.created", frozen=True, kw_only=True):
    """A response started (status ``in_progress``)."""

    response: RealtimeResponse


class ResponseOutputItemAdded(_Event, tag="response.output_item.added", frozen=True, kw_only=True):
    """One of the response's items (its message, or a function call), in progress."""

    response_id: str
    output_index: int
    item: Item


class ResponseOutputItemDone(_Event, tag="response.output_item.done", frozen=True, kw_only=True):
    """One of the response's items, complete (or incomplete if cut short)."""

    response_id: str
    output_index: int
    item: Item


class _Part(_Event, frozen=True, kw_only=True):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


class ResponseContentPartAdded(_Part, tag="response.content_part.added", frozen=True, kw_only=True):
    """The item's content part (``audio`` with its transcript, or ``text``)."""

    part: ItemContent


class ResponseContentPartDone(_Part, tag="response.content_part.done", frozen=True, kw_only=True):
    """The content part, complete."""

    part: ItemContent


class ResponseOutputAudioDelta(_Part, tag="response.output_audio.delta", frozen=True, kw_only=True):
    """Base64 audio in the session's output format."""

    delta: str


class ResponseOutputAudioDone(_Part, tag="response.output_audio.done", frozen=True, kw_only=True):
    """No more audio for this part."""


class ResponseOutputAudioTranscriptDelta(
    _Part, tag="response.output_audio_transcript.delta", frozen=True, kw_only=True
):
    """More of the spoken text."""

    delta: str


class ResponseOutputAudioTranscriptDone(
    _Part, tag="response.output_audio_transcript.done", frozen=True, kw_only=True
):
    """The whole spoken text."""

    transcript: str


class ResponseOutputTextDelta(_Part, tag="response.output_text.delta", frozen=True, kw_only=True):
    """More text (text-only responses)."""

    delta: str


class ResponseOutputTextDone(_Part, tag="response.output_text.done", frozen=True, kw_only=True):
    """The whole text (text-only responses)."""

    text: str


class ResponseFunctionCallArgumentsDelta(
    _Event, tag="response.function_call_arguments.delta", frozen=True, kw_only=True
):
    """More of a function call's arguments (JSON text)."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ResponseFunctionCallArgumentsDone(
    _Event, tag="response.function_call_arguments.done", frozen=True, kw_only=True
):
    """A function call's whole arguments, and its name."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class ResponseDone(_Event, tag="response.done", frozen=True, kw_only=True):
    """The response ended: ``completed``, ``cancelled``, ``incomplete`` or ``failed``."""

    response: RealtimeResponse


class ErrorEvent(_Event, tag="error", frozen=True, kw_only=True):
    """Something the client sent could not be acted on (the session goes on), or the
    session failed (a close frame follows)."""

    error: ErrorDetail


ServerEvent = (
    SessionCreated
    | SessionUpdated
    | InputAudioBufferSpeechStarted
    | InputAudioBufferSpeechStopped
    | InputAudioBufferTimeoutTriggered
    | InputAudioBufferCommitted
    | InputAudioBufferCleared
    | ConversationItemAdded
    | ConversationItemDone
    | ConversationItemTruncated
    | ConversationItemRetrieved
    | ConversationItemDeleted
    | RateLimitsUpdated
    | ConversationItemTranscriptionDelta
    | ConversationItemTranscriptionCompleted
    | ConversationItemTranscriptionFailed
    | ResponseCreated
    | ResponseOutputItemAdded
    | ResponseOutputItemDone
    | ResponseContentPartAdded
    | ResponseContentPartDone
    | ResponseOutputAudioDelta
    | ResponseOutputAudioDone
    | ResponseOutputAudioTranscriptDelta
    | ResponseOutputAudioTranscriptDone
    | ResponseOutputTextDelta
    | ResponseOutputTextDone
    | ResponseFunctionCallArgumentsDelta
    | ResponseFunctionCallArgumentsDone
    | ResponseDone
    | OutputAudioBufferStarted
    | OutputAudioBufferStopped
    | OutputAudioBufferCleared
    | ErrorEvent
)
"""Every event the server sends."""

BETA_NAMES: dict[str, str] = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
"""GA event name -> the beta API's name for it (the others are the same in both)."""


class ClientSecretCreated(msgspec.Struct, frozen=True, kw_only=True):
    """The reply to ``POST /v1/realtime/client_secrets``: the ephemeral key, when it
    expires (Unix seconds) and the session it opens."""

    value: str
    expires_at: int
    session: RealtimeSession
