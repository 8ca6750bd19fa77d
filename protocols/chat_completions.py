"""OpenAI's chat completions API as ``POST /v1/chat/completions`` serves it: the request,
the reply (``chat.completion``), the streamed chunks (``chat.completion.chunk``) and the
error body.

No parameter is dropped silently: a request field not declared here is refused with its
name, and a declared one the server cannot honour (``logprobs``, ``seed``, a JSON
``response_format`` …) is refused by name unless it holds its neutral value (``top_p:
1``, ``logprobs: false`` …, what a client's defaults send). Messages are a tagged union
on ``role`` and content parts on ``type``, so a request decodes in one pass into exactly
one shape per message, and a malformed one is refused with the path of the offending
field.

Audio output follows OpenAI's: ``modalities: ["text", "audio"]`` with ``audio: {voice,
format}``; the reply's ``message.audio`` (or, streamed, ``delta.audio`` pieces) carries
base64 audio and its transcript, and ``message.content`` is null.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "AssistantAudio",
    "AssistantMessage",
    "AssistantReply",
    "AudioOutput",
    "ChatAudio",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "Choice",
    "ChunkChoice",
    "ContentPart",
    "DeveloperMessage",
    "Delta",
    "DeltaAudio",
    "ErrorBody",
    "ErrorDetail",
    "FinishReason",
    "FunctionCall",
    "FunctionCallDelta",
    "FunctionDefinition",
    "NamedToolChoice",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "InputAudio",
    "InputAudioPart",
    "Message",
    "OutputAudioFormat",
    "ResponseFormat",
    "StreamOptions",
    "SystemMessage",
    "TextPart",
    "ToolMessage",
    "Usage",
    "UserMessage",
    "VoiceRef",
]

# -- request -----------------------------------------------------------------------------


class TextPart(msgspec.Struct, tag_field="type", tag="text", frozen=True, kw_only=True):
    """A text content part."""

    text: str


class InputAudio(msgspec.Struct, frozen=True, kw_only=True):
    """Audio the user sent: base64 ``data`` in ``format`` (``wav``, or ``pcm16``: 24 kHz
    mono little-endian PCM16 without a header)."""

    data: str
    format: str


class InputAudioPart(
    msgspec.Struct, tag_field="type", tag="input_audio", frozen=True, kw_only=True
):
    """An audio content part."""

    input_audio: InputAudio


ContentPart = TextPart | InputAudioPart
"""A user message's content part, by ``type``."""


class SystemMessage(msgspec.Struct, tag_field="role", tag="system", frozen=True, kw_only=True):
    """Instructions for the model (the entry stage's ``instructions`` input)."""

    content: str | list[TextPart]


class DeveloperMessage(
    msgspec.Struct, tag_field="role", tag="developer", frozen=True, kw_only=True
):
    """Instructions for the model; the newer name of a system message."""

    content: str | list[TextPart]


class UserMessage(msgspec.Struct, tag_field="role", tag="user", frozen=True, kw_only=True):
    """A user turn: text, or parts of text and audio in order."""

    content: str | list[ContentPart]


class FunctionCall(msgspec.Struct, frozen=True, kw_only=True):
    """``function`` of a tool call: the function's name and its arguments (JSON text)."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A call of a tool the model made (in a reply, or given back in an assistant message)."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class AssistantAudio(msgspec.Struct, frozen=True, kw_only=True):
    """An assistant message's ``audio``: the earlier audio reply it refers to.

    OpenAI sends back its ``id`` alone; the server keeps no audio to look one up, so
    the turn's words must come with it: the message's ``content``, or ``transcript``
    (which a reply's own ``message.audio`` carries, so a client that appends the reply
    message it got to its history sends them). The audio itself is not the model's
    input: its context holds the words it said.
    """

    id: str
    transcript: str | None = None


class AssistantMessage(
    msgspec.Struct, tag_field="role", tag="assistant", frozen=True, kw_only=True
):
    """An earlier reply of the model: an assistant turn of the conversation, taken by
    its words (``content``, else ``audio.transcript``) and the tools it called."""

    content: str | list[TextPart] | None = None
    audio: AssistantAudio | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(msgspec.Struct, tag_field="role", tag="tool", frozen=True, kw_only=True):
    """A tool's result, for the call ``tool_call_id`` of an earlier assistant message."""

    content: str | list[TextPart] | None = None
    tool_call_id: str | None = None


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage
"""One message of a request, by ``role``."""

OutputAudioFormat = Literal["wav", "aac", "mp3", "flac", "opus", "pcm16"]
"""The formats OpenAI names; this server writes ``wav`` and ``pcm16`` (24 kHz PCM16)."""


class VoiceRef(msgspec.Struct, frozen=True, kw_only=True):
    """A voice given by id (``{"id": "voice_1234"}``)."""

    id: str


class AudioOutput(msgspec.Struct, frozen=True, kw_only=True):
    """``audio``: how to voice the reply (needed with the ``audio`` modality)."""

    voice: str | VoiceRef
    format: OutputAudioFormat


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    """``stream_options``: with ``include_usage``, a last chunk carries the usage."""

    include_usage: bool = False


class FunctionDefinition(msgspec.Struct, frozen=True, kw_only=True):
    """A function the model may call: its name, description and JSON Schema."""

    name: str
    description: str | None = None
    parameters: dict[str, object] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    """One of ``tools``: ``{"type": "function", "function": {...}}`` (another type is
    refused by name)."""

    type: str
    function: FunctionDefinition | None = None


class NamedToolChoice(msgspec.Struct, frozen=True, kw_only=True):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: str
    function: dict[str, str] | None = None


class ResponseFormat(msgspec.Struct, frozen=True, kw_only=True):
    """``response_format``: ``{"type": "text"}`` is served; ``json_object`` and
    ``json_schema`` are refused (nothing constrains the reply to JSON)."""

    type: str
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/chat/completions``; any other field is refused.

    Attributes:
        messages: the conversation: system/developer messages, user turns and earlier
            replies (assistant messages), in order.
        model: any name; echoed in the reply.
        modalities: ``["text"]`` (default) or ``["text", "audio"]``.
        audio: the voice and format of the reply's audio (with ``audio``).
        stream: reply as server-sent events, chunk by chunk.
        stream_options: what the stream ends with.
        max_completion_tokens: the reply's most text tokens (``max_tokens``: its
            deprecated name, used if this is absent).
        temperature: sampling temperature (0: greedy).
        n: replies per request; only 1 is served.
        tools: the functions the model may call.
        tool_choice: ``auto`` (the default with tools) or ``none``.
        parallel_tool_calls: accepted; a reply may make several calls either way.
        stop: up to 4 strings; the reply's text ends before the first it contains
            (text replies; a voiced reply is refused it).
        response_format: ``{"type": "text"}`` only.
        top_p, frequency_penalty, presence_penalty, logprobs, top_logprobs, logit_bias,
            seed, store, metadata, service_tier: declared so that a value the server
            cannot honour is refused by name; their neutral values (``1``, ``0``,
            ``false``, ``{}``, ``"auto"``) are what the server does anyway.
    """

    messages: list[Message]
    model: str = ""
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    n: int | None = 1
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    stop: str | list[str] | None = None
    response_format: ResponseFormat | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None


# -- reply -------------------------------------------------------------------------------

FinishReason = Literal["stop", "length", "tool_calls"]
"""Why a reply ended: its natural end, ``max_completion_tokens``, or a call of a tool."""


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts, as the entry engine counted them: prompt tokens are its context
    (the conversation the reply was made from), completion tokens the text tokens it
    generated (the audio's codec frames are not counted)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatAudio(msgspec.Struct, frozen=True, kw_only=True):
    """``message.audio``: the whole reply's audio and transcript.

    ``expires_at`` is 24 hours after the reply's ``created``, as OpenAI's.
    """

    id: str
    data: str
    expires_at: int
    transcript: str


class AssistantReply(msgspec.Struct, frozen=True, kw_only=True):
    """``message``: the reply; ``content`` is null when it is voiced (see ``audio``)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    audio: ChatAudio | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    """The one reply of a ``chat.completion``."""

    index: int = 0
    message: AssistantReply
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(msgspec.Struct, frozen=True, kw_only=True):
    """The reply to a request without ``stream``."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


# -- streamed reply ----------------------------------------------------------------------


class DeltaAudio(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``delta.audio``: a piece of the reply's audio (``data``: base64 PCM16 at 24 kHz)
    or transcript; the last piece carries ``expires_at`` only (and ``id``)."""

    id: str
    data: str | None = None
    transcript: str | None = None
    expires_at: int | None = None


class FunctionCallDelta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``function`` of a streamed call's piece: its ``name`` (first piece only) and the
    next piece of its ``arguments`` text."""

    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One of ``delta.tool_calls``: a piece of the call at ``index`` (its place in the
    reply), as OpenAI streams one: the first piece carries its ``id``, ``type`` and
    function's name (with empty arguments), each later one a piece of its arguments."""

    index: int
    function: FunctionCallDelta
    id: str | None = None
    type: Literal["function"] | None = None


class Delta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``delta``: what a chunk adds to the reply (absent fields add nothing)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: DeltaAudio | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, frozen=True, kw_only=True):
    """The one choice of a ``chat.completion.chunk``."""

    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct, frozen=True, kw_only=True):
    """One server-sent event of a streamed reply (``data: {chunk}``).

    The stream: a chunk with ``delta.role``, the reply's pieces, a chunk with
    ``finish_reason``, with ``stream_options.include_usage`` a chunk with no choices
    and the ``usage``, then ``data: [DONE]``.
    """

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


# -- errors ------------------------------------------------------------------------------


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    """What went wrong, as OpenAI reports it.

    Attributes:
        message: what happened and what to do.
        type: ``invalid_request_error`` (4xx: the request is at fault) or
            ``server_error`` (5xx).
        param: the offending field, if one.
        code: for programs (e.g. ``busy``, ``invalid_api_key``, or the pipeline's error
            code when a reply failed).
    """

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """An error reply's body (also a stream's last event when a reply fails midway)."""

    error: ErrorDetail
