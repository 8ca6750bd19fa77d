"""Client → server events of the OpenAI Realtime API (GA names; beta forms accepted).

A client speaks to ``/v1/realtime`` in JSON text frames, one event each, tagged by
``type``. :func:`decode_client_event` reads one in two steps — the envelope (``type``,
``event_id``), then the event's own struct — so that an unknown ``type`` and a field of
the wrong shape are told apart, and the ``error`` the server answers names the client's
``event_id`` in both cases.

Function tools (``session.tools``, ``tool_choice``) and their items
(``function_call_output``) are read here; fields the server does not act on (noise
reduction, tracing …) are accepted and ignored, so a client written for OpenAI's
service connects unchanged.
The beta API's flat ``session.update`` (``modalities``, ``input_audio_format``,
``voice``, ``turn_detection`` at the top level) is read by the same struct: its fields
are aliases of the GA nested ones (see ``omni_actors.server.session_config``).
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

__all__ = [
    "CLIENT_EVENTS",
    "AudioFormat",
    "AudioInputConfig",
    "AudioOutputConfig",
    "ClientEvent",
    "ClientSecretCreate",
    "ClientEventError",
    "ContentPart",
    "FunctionTool",
    "ToolChoiceFunction",
    "ConversationItemCreate",
    "ConversationItemDelete",
    "ConversationItemRetrieve",
    "ConversationItemTruncate",
    "InputAudioBufferAppend",
    "InputAudioBufferClear",
    "InputAudioBufferCommit",
    "ItemParam",
    "ResponseCancel",
    "ResponseCreate",
    "ResponseParams",
    "SessionAudioConfig",
    "SessionConfig",
    "SessionUpdate",
    "TranscriptionConfig",
    "TurnDetection",
    "ExpiresAfter",
    "RetentionRatio",
    "TokenLimits",
    "Truncation",
    "decode_client_event",
]

Modality = Literal["text", "audio"]
MaxTokens = int | Literal["inf"]


class AudioFormat(msgspec.Struct, frozen=True, kw_only=True):
    """``{"type": "audio/pcm", "rate": 24000}``, ``{"type": "audio/pcmu"}`` or
    ``{"type": "audio/pcma"}``."""

    type: str
    rate: int | None = None


class TurnDetection(msgspec.Struct, frozen=True, kw_only=True):
    """``turn_detection``: ``server_vad`` (``threshold``, ``prefix_padding_ms``,
    ``silence_duration_ms``, ``idle_timeout_ms``) or ``semantic_vad`` (``eagerness``);
    both take ``create_response`` and ``interrupt_response``. ``idle_timeout_ms: null``
    turns the idle timeout off (left out: unchanged)."""

    type: str = "server_vad"
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | msgspec.UnsetType | None = msgspec.UNSET
    eagerness: str | None = None


class TranscriptionConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``session.audio.input.transcription`` (beta: ``input_audio_transcription``): the
    transcription model of the user's audio, its ``language`` and a ``prompt``."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioInputConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``session.audio.input``; ``turn_detection: null`` turns detection off, and
    ``transcription: null`` transcription."""

    format: AudioFormat | None = None
    turn_detection: TurnDetection | msgspec.UnsetType | None = msgspec.UNSET
    transcription: TranscriptionConfig | msgspec.UnsetType | None = msgspec.UNSET


class AudioOutputConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``session.audio.output`` and ``response.audio.output`` (a ``speed`` other than 1
    is refused by name)."""

    format: AudioFormat | None = None
    voice: str | None = None
    speed: float | None = None


class SessionAudioConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``session.audio``."""

    input: AudioInputConfig | None = None
    output: AudioOutputConfig | None = None


class FunctionTool(msgspec.Struct, frozen=True, kw_only=True):
    """A tool of ``session.tools``: ``{"type": "function", "name", "description",
    "parameters"}`` (JSON Schema). Another ``type`` (``mcp``) is refused by name."""

    type: str = "function"
    name: str | None = None
    description: str | None = None
    parameters: dict[str, object] | None = None


class ToolChoiceFunction(msgspec.Struct, frozen=True, kw_only=True):
    """``tool_choice: {"type": "function", "name": ...}`` (refused: the model chooses)."""

    type: str
    name: str | None = None


ToolChoice = str | ToolChoiceFunction


class TokenLimits(msgspec.Struct, frozen=True, kw_only=True):
    """A retention-ratio truncation's own limit: conversation tokens after the
    instructions."""

    post_instructions: int | None = None


class RetentionRatio(msgspec.Struct, frozen=True, kw_only=True):
    """``truncation: {"type": "retention_ratio", "retention_ratio": r}``: past the
    context, drop the oldest turns until ``r`` of the limit is used."""

    type: str
    retention_ratio: float
    token_limits: TokenLimits | None = None


Truncation = str | RetentionRatio


class SessionConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The ``session`` of ``session.update``: GA nested fields, then beta flat aliases.

    Every field is optional: an update changes only what it names.
    """

    type: str | None = None
    model: str | None = None
    output_modalities: list[Modality] | None = None
    instructions: str | None = None
    audio: SessionAudioConfig | None = None
    max_output_tokens: MaxTokens | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    truncation: Truncation | None = None
    # Beta (flat) names.
    modalities: list[Modality] | None = None
    input_audio_format: str | None = None
    output_audio_format: str | None = None
    voice: str | None = None
    speed: float | None = None
    turn_detection: TurnDetection | msgspec.UnsetType | None = msgspec.UNSET
    input_audio_transcription: TranscriptionConfig | msgspec.UnsetType | None = msgspec.UNSET
    temperature: float | None = None
    max_response_output_tokens: MaxTokens | None = None


class ExpiresAfter(msgspec.Struct, frozen=True, kw_only=True):
    """When a client secret expires: ``seconds`` after its ``anchor``, its creation."""

    anchor: str = "created_at"
    seconds: int = 600


class ClientSecretCreate(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``POST /v1/realtime/client_secrets``: how long the key lives and the
    session config it is bound to."""

    expires_after: ExpiresAfter | None = None
    session: SessionConfig | None = None


class ContentPart(msgspec.Struct, frozen=True, kw_only=True):
    """One content part of an item: ``input_text`` (``text``) or ``input_audio``
    (``audio``, base64 in the session's input format)."""

    type: str
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class ItemParam(msgspec.Struct, frozen=True, kw_only=True):
    """The ``item`` of ``conversation.item.create``: a ``message`` (``role``,
    ``content``) or a ``function_call_output`` (``call_id``, ``output``)."""

    type: str = "message"
    id: str | None = None
    role: str | None = None
    content: list[ContentPart] = []
    call_id: str | None = None
    output: str | None = None
    name: str | None = None
    arguments: str | None = None


class ResponseAudioParams(msgspec.Struct, frozen=True, kw_only=True):
    """``response.audio``."""

    output: AudioOutputConfig | None = None


class ResponseParams(msgspec.Struct, frozen=True, kw_only=True):
    """The ``response`` of ``response.create``: per-response overrides."""

    output_modalities: list[Modality] | None = None
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    audio: ResponseAudioParams | None = None
    conversation: str | None = None
    input: list[ItemParam] | None = None
    metadata: dict[str, str] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    # Beta (flat) names.
    modalities: list[Modality] | None = None
    voice: str | None = None
    temperature: float | None = None
    max_response_output_tokens: MaxTokens | None = None


class _Event(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    event_id: str | None = None


class SessionUpdate(_Event, tag="session.update", frozen=True, kw_only=True):
    """Change the session's settings; answered by ``session.updated``."""

    session: SessionConfig


class InputAudioBufferAppend(_Event, tag="input_audio_buffer.append", frozen=True, kw_only=True):
    """Append base64 audio (the session's input format) to the input buffer."""

    audio: str


class InputAudioBufferCommit(_Event, tag="input_audio_buffer.commit", frozen=True, kw_only=True):
    """Make the input buffer a user message item (not needed with server VAD)."""


class InputAudioBufferClear(_Event, tag="input_audio_buffer.clear", frozen=True, kw_only=True):
    """Drop the input buffer."""


class ConversationItemCreate(_Event, tag="conversation.item.create", frozen=True, kw_only=True):
    """Add an item (a user message, or a system message: instructions)."""

    item: ItemParam
    previous_item_id: str | None = None


class ConversationItemTruncate(_Event, tag="conversation.item.truncate", frozen=True, kw_only=True):
    """Cut the last assistant item's audio to what the user heard."""

    item_id: str
    content_index: int = 0
    audio_end_ms: int


class ConversationItemRetrieve(_Event, tag="conversation.item.retrieve", frozen=True, kw_only=True):
    """Ask for an item as the server holds it (``conversation.item.retrieved``)."""

    item_id: str


class ConversationItemDelete(_Event, tag="conversation.item.delete", frozen=True, kw_only=True):
    """Take an item out of the conversation: no later response sees it."""

    item_id: str


class ResponseCreate(_Event, tag="response.create", frozen=True, kw_only=True):
    """Start a response to the conversation so far."""

    response: ResponseParams | None = None


class ResponseCancel(_Event, tag="response.cancel", frozen=True, kw_only=True):
    """Cancel the response in flight (the one named, if ``response_id`` is given)."""

    response_id: str | None = None


class OutputAudioBufferClear(_Event, tag="output_audio_buffer.clear", frozen=True, kw_only=True):
    """Stop the reply playing in a call, cut where the caller is (WebRTC calls only)."""


ClientEvent = (
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemTruncate
    | ConversationItemRetrieve
    | ConversationItemDelete
    | ResponseCreate
    | ResponseCancel
    | OutputAudioBufferClear
)
"""Every client event the server acts on."""

CLIENT_EVENTS: dict[str, type[ClientEvent]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in (
        SessionUpdate,
        InputAudioBufferAppend,
        InputAudioBufferCommit,
        InputAudioBufferClear,
        ConversationItemCreate,
        ConversationItemTruncate,
        ConversationItemRetrieve,
        ConversationItemDelete,
        ResponseCreate,
        ResponseCancel,
        OutputAudioBufferClear,
    )
}
"""Event type -> struct."""


class _Envelope(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    event_id: str | None = None


class ClientEventError(Exception):
    """A client event that cannot be acted on, with what the ``error`` event says.

    Attributes:
        code: ``invalid_json``, ``unknown_event`` or ``invalid_event``.
        event_id: the client's ``event_id``, if it could be read.
        param: the offending field's path (``$.session.audio``), if known.
    """

    def __init__(
        self, code: str, message: str, *, event_id: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.event_id = event_id
        self.param = param


_envelope = msgspec.json.Decoder(_Envelope)
_decoders = {name: msgspec.json.Decoder(cls) for name, cls in CLIENT_EVENTS.items()}


def decode_client_event(data: bytes | str) -> ClientEvent:
    """Read one client event.

    Raises:
        ClientEventError: not a JSON object with a string ``type``; a ``type`` the
            server does not know; a field missing or of the wrong type.
    """
    try:
        envelope = _envelope.decode(data)
    except msgspec.DecodeError as exc:
        if isinstance(exc, msgspec.ValidationError):
            raise ClientEventError(
                "invalid_event", f"an event is a JSON object with a string 'type': {exc}"
            ) from None
        raise ClientEventError("invalid_json", f"not valid JSON: {exc}") from None
    decoder = _decoders.get(envelope.type)
    if decoder is None:
        raise ClientEventError(
            "unknown_event",
            f"unknown event type {envelope.type!r}; this server accepts "
            + ", ".join(sorted(_decoders)),
            event_id=envelope.event_id,
            param="type",
        )
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        raise ClientEventError(
            "invalid_event",
            f"{envelope.type}: {text}",
            event_id=envelope.event_id,
            param=_param(text),
        ) from None


def _param(message: str) -> str | None:
    """The path of the field a msgspec validation ``message`` is about: the ``at`` path,
    down to the missing field if one is (``$.item_id``)."""
    where = message.rpartition(" - at `")[2].rstrip("`") if " - at `" in message else None
    missing = re.search(r"missing required field `([^`]+)`", message)
    if missing is None:
        return where
    return f"{where or '$'}.{missing.group(1)}"
