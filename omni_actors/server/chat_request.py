"""``ChatPlan``: a chat completion request checked and turned into session operations.

Everything a request can get wrong is found here, before the request takes a session
slot: the JSON and its types (msgspec, with the path of the offending field), the
audio (base64, WAV or PCM16), the options (``max_completion_tokens``, ``temperature``,
``voice`` — one the server takes, see ``voices.py`` — and ``stop``), the tools
(``tools``, ``tool_choice``, assistant ``tool_calls`` and ``tool`` messages, which the
entry stage must take), earlier replies that cannot be taken (an ``audio`` id with no
words: the server keeps no audio; a pipeline whose entry stage keeps no conversation),
the parameters the server cannot honour (an unknown field, ``logprobs``, a JSON
``response_format`` …: refused by name, never dropped), and what a pipeline cannot do
yet (stream WAV). Each refusal is a :class:`ChatRequestError` with the HTTP status,
OpenAI's ``param`` and ``code``, and a message that says what to send instead.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Final, Literal

import msgspec
import torch

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    REPLY_FIELD,
    TOOL_CALLS_FIELD,
    TOOL_RESULT_FIELD,
    TOOLS_FIELD,
)
from omni_actors.audio.wav import AudioFormatError, decode_wav
from omni_actors.errors import InvalidRequestError
from omni_actors.pipeline.response import checked_options
from omni_actors.pipeline.session import Modality
from omni_actors.pipeline.spec.pipeline import PipelineSpec
from omni_actors.protocols.chat_completions import (
    AssistantAudio,
    AssistantMessage,
    ChatCompletionRequest,
    DeveloperMessage,
    InputAudioPart,
    NamedToolChoice,
    SystemMessage,
    TextPart,
    Tool,
    ToolMessage,
    UserMessage,
    VoiceRef,
)
from omni_actors.protocols.stage import ResponseOptions
from omni_actors.server.audio_format import AudioPayloadError, decode_audio, format_rate
from omni_actors.server.model_list import MODEL_NOT_FOUND, unknown_model
from omni_actors.server.tools import OfferedTool, template_tools
from omni_actors.server.voices import ANY_VOICE, UnknownVoiceError, VoiceMap

__all__ = ["ChatPlan", "ChatRequestError", "ReplyTurn", "TurnPart", "plan_request"]


OUTPUT_RATE: Final = format_rate("audio/pcm")
"""The rate of the audio a reply carries (OpenAI's 24 kHz PCM16)."""

_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_AT = re.compile(r"- at `\$\.(.+)`$")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MAX_STOPS = 4  # as OpenAI


class ChatRequestError(InvalidRequestError):
    """A request the server refuses; nothing was started.

    Attributes:
        status: the HTTP status (400, 401, 413, 503, ...).
        param: the offending field, if one (``messages[1].content[0].input_audio``).
        error_code: OpenAI's ``error.code`` (``invalid_value``, ``busy``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        error_code: str = "invalid_request",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class TurnPart:
    """One piece of a turn, sent with ``Session.send``: text, audio samples at
    ``sample_rate``, or a tool's result (``tool_result``, in a user turn); or, alone in
    its turn, an earlier assistant turn that called tools (``tool_calls``: the
    entry stage's ``TOOL_CALLS_FIELD``, sent with no commit after it)."""

    text: str | None = None
    audio: torch.Tensor | None = None
    sample_rate: int | None = None
    tool_result: str | None = None

    def fields(self) -> dict[str, str]:
        """The named fields it sends (a tool's result)."""
        if self.tool_result is not None:
            return {TOOL_RESULT_FIELD: self.tool_result}
        return {}


@dataclass(frozen=True, slots=True)
class ReplyTurn:
    """An earlier reply (an assistant message), sent with ``Session.add_reply``: its
    words, and the tools it called (a JSON array of calls; None: it called none)."""

    text: str
    tool_calls: str | None = None


@dataclass(frozen=True, slots=True)
class ChatPlan:
    """What to do with a request.

    Attributes:
        model: the name the reply carries.
        modalities: the session's outputs (``("text", "audio")`` when audio is wanted).
        audio_format: ``wav`` or ``pcm16`` when audio is wanted, else None.
        instructions: the system/developer messages, joined (sent as the entry
            stage's ``instructions`` field; "" when none or the engine takes none).
        turns: the conversation's turns, in order: each user message's parts (a
            committed turn) and each earlier reply.
        options: the checked response options (``max_tokens``, ``temperature``, ``voice``).
        stream: reply as server-sent events.
        include_usage: end the stream with a usage chunk.
        tools: the tools to offer, as the entry stage's ``TOOLS_FIELD`` (None when the
            entry stage takes no tools).
        tool_names: the functions the reply may call: its text is read for calls (None
            when the entry stage takes no tools).
        stop: the stop strings: the reply's text ends before the first it contains.
    """

    model: str
    modalities: tuple[Modality, ...]
    audio_format: Literal["wav", "pcm16"] | None
    instructions: str
    turns: list[list[TurnPart] | ReplyTurn]
    options: ResponseOptions
    stream: bool
    include_usage: bool = False
    tools: str | None = None
    tool_names: frozenset[str] | None = None
    stop: tuple[str, ...] = ()


def plan_request(
    body: bytes,
    spec: PipelineSpec,
    *,
    model: str,
    max_bytes: int,
    voices: VoiceMap = ANY_VOICE,
) -> ChatPlan:
    """Decode and check a request body for a pipeline.

    Args:
        body: the request's JSON.
        spec: the served pipeline (its entry stage decides whether instructions apply).
        model: the served model's name: a request naming another is refused (404).
        max_bytes: the most decoded bytes one audio part may hold.
        voices: the voice names the server takes (``audio.voice`` must be one; the
            plan asks for the speaker it names).

    Raises:
        ChatRequestError: the request cannot be served as sent.
    """
    try:
        request = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        # msgspec names the field as "... - at `$.messages[0].role`".
        where = _AT.search(str(exc))
        unknown = _UNKNOWN.search(str(exc))
        if unknown is not None:
            name = (where.group(1) + "." if where else "") + unknown.group(1)
            raise ChatRequestError(
                f"unrecognized request parameter {name!r}: this server does not support "
                "it; leave it out",
                param=name,
                error_code="unknown_parameter",
            ) from None
        raise ChatRequestError(
            f"invalid request: {exc}",
            param=where.group(1) if where else None,
            error_code="invalid_value",
        ) from None
    except msgspec.DecodeError as exc:
        raise ChatRequestError(
            f"the body is not valid JSON ({exc}); send a JSON object", error_code="invalid_json"
        ) from None
    refusal = unknown_model(request.model, model)
    if refusal is not None:
        raise ChatRequestError(refusal, status=404, param="model", error_code=MODEL_NOT_FOUND)
    if request.n not in (None, 1):
        raise ChatRequestError(
            f"n={request.n}: one reply per request is served; send n=1 (or none)",
            param="n",
            error_code="invalid_value",
        )
    _check_parameters(request)
    audio_format, voice = _audio_output(request)
    stops = _stops(request.stop, voiced=audio_format is not None)
    if voice is not None:
        try:
            voice = voices.speaker(voice)
        except UnknownVoiceError as exc:
            raise ChatRequestError(
                str(exc), param="audio.voice", error_code="invalid_value"
            ) from None
    stream = bool(request.stream)
    if stream and audio_format == "wav":
        raise ChatRequestError(
            'audio.format "wav" cannot be streamed; use "pcm16" with stream: true '
            "(24 kHz mono PCM16), as OpenAI does",
            param="audio.format",
            error_code="unsupported_value",
        )
    max_tokens = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    try:
        options = checked_options(max_tokens, request.temperature, voice)
    except InvalidRequestError as exc:
        name = "temperature" if "temperature" in str(exc) else "max_completion_tokens"
        raise ChatRequestError(str(exc), param=name, error_code="invalid_value") from None
    offered = _tools(request, spec)
    instructions, turns = _messages(request, spec, max_bytes)
    takes_tools = TOOLS_FIELD in spec.ports(spec.entry_stage).inputs
    return ChatPlan(
        model=model,
        modalities=("text", "audio") if audio_format is not None else ("text",),
        audio_format=audio_format,
        instructions=instructions,
        turns=turns,
        options=options,
        stream=stream,
        include_usage=stream
        and request.stream_options is not None
        and request.stream_options.include_usage,
        tools=template_tools(offered) if takes_tools else None,
        tool_names=frozenset(t.name for t in offered) if takes_tools else None,
        stop=stops,
    )


def _tools(request: ChatCompletionRequest, spec: PipelineSpec) -> list[OfferedTool]:
    """The tools offered to the model (none with ``tool_choice: "none"``)."""
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice) or choice not in (None, "auto", "none"):
        named = f"a {choice.type} choice" if isinstance(choice, NamedToolChoice) else choice
        raise ChatRequestError(
            f"tool_choice {named!r} is not supported: the model decides whether to call a "
            'tool; send "auto" (or "none" to offer none)',
            param="tool_choice",
            error_code="unsupported_value",
        )
    tools = request.tools or []
    if tools and TOOLS_FIELD not in spec.ports(spec.entry_stage).inputs:
        raise ChatRequestError(
            f"this pipeline's entry stage {spec.entry_stage} takes no tools (its engine "
            f"does not declare {TOOLS_FIELD!r} among its inputs): send no tools",
            param="tools",
            error_code="unsupported_parameter",
        )
    offered: list[OfferedTool] = []
    for i, tool in enumerate(tools):
        offered.append(_tool(tool, f"tools[{i}]", {t.name for t in offered}))
    return [] if choice == "none" else offered


def _tool(tool: Tool, where: str, taken: set[str]) -> OfferedTool:
    if tool.type != "function" or tool.function is None:
        raise ChatRequestError(
            f'{where}: tools of type {tool.type!r} are not supported; send {{"type": '
            '"function", "function": {"name": ..., "parameters": {...}}}',
            param=f"{where}.type",
            error_code="unsupported_value",
        )
    function = tool.function
    if not function.name or function.name in taken:
        problem = "has no name" if not function.name else f"is named {function.name!r} twice"
        raise ChatRequestError(
            f"{where}: the function {problem}; give each tool a name of its own",
            param=f"{where}.function.name",
            error_code="invalid_value",
        )
    return OfferedTool(function.name, function.description, function.parameters)


def _check_parameters(request: ChatCompletionRequest) -> None:
    """Refuse, by name, each parameter set to a value the server cannot honour."""
    neutral: dict[str, tuple[object, ...]] = {
        "top_p": (None, 1),
        "frequency_penalty": (None, 0),
        "presence_penalty": (None, 0),
        "logprobs": (None, False),
        "top_logprobs": (None,),
        "logit_bias": (None, {}),
        "seed": (None,),
        "store": (None, False),
        "metadata": (None, {}),
        "service_tier": (None, "auto", "default"),
    }
    for name, allowed in neutral.items():
        value = getattr(request, name)
        if value not in allowed:  # msgspec typed each: no True passes for 1
            raise ChatRequestError(
                f"{name}={value!r} is not supported by this server; leave it out"
                + (f" or send {allowed[1]!r}" if len(allowed) > 1 else ""),
                param=name,
                error_code="unsupported_parameter",
            )
    response_format = request.response_format
    if response_format is not None and response_format.type != "text":
        raise ChatRequestError(
            f'response_format {{"type": "{response_format.type}"}} is not supported: nothing '
            'constrains the reply to JSON here; send {"type": "text"} or leave it out and '
            "ask for JSON in the instructions",
            param="response_format",
            error_code="unsupported_value",
        )


def _stops(stop: str | list[str] | None, *, voiced: bool) -> tuple[str, ...]:
    """The stop strings of a request (checked)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not stops:
        return ()
    if voiced:
        raise ChatRequestError(
            "stop is served for text replies only: a voiced reply is spoken as its text "
            "streams, before a stop string could be seen; leave stop out, or ask for "
            'modalities ["text"]',
            param="stop",
            error_code="unsupported_parameter",
        )
    if len(stops) > _MAX_STOPS or not all(stops):
        raise ChatRequestError(
            f"stop takes 1 to {_MAX_STOPS} non-empty strings, got {stops!r}",
            param="stop",
            error_code="invalid_value",
        )
    return tuple(stops)


def _audio_output(
    request: ChatCompletionRequest,
) -> tuple[Literal["wav", "pcm16"] | None, str | None]:
    """The reply's audio format and voice; (None, None) for a text reply."""
    modalities = request.modalities or ["text"]
    if "audio" not in modalities:
        return None, None
    audio = request.audio
    if audio is None:
        raise ChatRequestError(
            'the "audio" modality needs audio: {"voice": ..., "format": "wav" | "pcm16"}',
            param="audio",
            error_code="missing_required_parameter",
        )
    if audio.format not in ("wav", "pcm16"):
        raise ChatRequestError(
            f'audio.format "{audio.format}" is not supported; use "wav" or "pcm16"',
            param="audio.format",
            error_code="unsupported_value",
        )
    voice = audio.voice.id if isinstance(audio.voice, VoiceRef) else audio.voice
    return audio.format, voice or None


def _messages(
    request: ChatCompletionRequest, spec: PipelineSpec, max_bytes: int
) -> tuple[str, list[list[TurnPart] | ReplyTurn]]:
    """The joined instructions and the turns."""
    texts: list[str] = []
    turns: list[list[TurnPart] | ReplyTurn] = []
    has_user = False
    calls: set[str] = set()  # the ids of the tool calls of earlier assistant messages
    results = False  # the last turn holds tool results: the next one joins it
    for i, message in enumerate(request.messages):
        where = f"messages[{i}]"
        joins, results = results, False
        match message:
            case SystemMessage(content=content) | DeveloperMessage(content=content):
                text = content if isinstance(content, str) else _joined(content)
                if text and INSTRUCTIONS_FIELD not in spec.entry_inputs():
                    raise ChatRequestError(
                        f"{where}: this pipeline's entry stage ({spec.entry_stage}) takes no "
                        f"instructions (its engine does not declare {INSTRUCTIONS_FIELD!r} "
                        "among its inputs): send the user messages only",
                        param=where,
                        error_code="unsupported_message",
                    )
                texts.append(text)
            case UserMessage(content=content):
                turns.append(_user_turn(content, where, max_bytes))
                has_user = True
            case AssistantMessage(content=content, audio=audio, tool_calls=tool_calls):
                if tool_calls:
                    _check_takes(spec, TOOL_CALLS_FIELD, where)
                    turns.append(_tool_calls(message, where, calls))
                    continue
                if REPLY_FIELD not in spec.entry_inputs():
                    raise ChatRequestError(
                        f"{where}: this pipeline's entry stage ({spec.entry_stage}) keeps no "
                        "conversation it can be given an earlier reply in; send the system "
                        "and user messages only",
                        param=where,
                        error_code="unsupported_message",
                    )
                turns.append(ReplyTurn(_reply_text(content, audio, where)))
            case ToolMessage(content=content, tool_call_id=call_id):
                _check_takes(spec, TOOL_RESULT_FIELD, where)
                if call_id not in calls:
                    raise ChatRequestError(
                        f"{where}: tool_call_id {call_id!r} is not the id of a tool call of "
                        "an earlier assistant message; answer one of their tool_calls",
                        param=f"{where}.tool_call_id",
                        error_code="invalid_value",
                    )
                result = TurnPart(
                    tool_result=content if isinstance(content, str) else _joined(content or [])
                )
                last = turns[-1] if joins else None
                if isinstance(last, list):  # consecutive results are one turn, as templates
                    last.append(result)  # render them
                else:
                    turns.append([result])
                results = True
    if not has_user:
        raise ChatRequestError(
            "the request has no user message: send at least one",
            param="messages",
            error_code="missing_required_parameter",
        )
    return "\n".join(t for t in texts if t), turns


def _check_takes(spec: PipelineSpec, field: str, where: str) -> None:
    if field not in spec.ports(spec.entry_stage).inputs:
        raise ChatRequestError(
            f"{where}: this pipeline's entry stage {spec.entry_stage} takes no tool calls or "
            f"results (its engine does not declare {field!r} among its inputs)",
            param=where,
            error_code="unsupported_message",
        )


def _tool_calls(message: AssistantMessage, where: str, calls: set[str]) -> ReplyTurn:
    """An assistant message with tool calls, as the entry stage takes it back."""
    functions = []
    for j, call in enumerate(message.tool_calls or []):
        try:
            json.loads(call.function.arguments)
        except ValueError as exc:
            raise ChatRequestError(
                f"{where}: the arguments of tool call {call.id!r} are not JSON ({exc})",
                param=f"{where}.tool_calls[{j}].function.arguments",
                error_code="invalid_value",
            ) from None
        calls.add(call.id)
        function = {"name": call.function.name, "arguments": call.function.arguments}
        functions.append({"type": "function", "function": function})
    content = message.content
    text = content if isinstance(content, str) or content is None else _joined(content)
    return ReplyTurn(text or "", json.dumps(functions))


def _joined(parts: list[TextPart]) -> str:
    return "".join(p.text for p in parts)


def _reply_text(
    content: str | list[TextPart] | None, audio: AssistantAudio | None, where: str
) -> str:
    """An assistant message's words: its content, else its audio's transcript."""
    text = content if isinstance(content, str) else None if content is None else _joined(content)
    if text:
        return text
    if audio is not None and audio.transcript is not None:
        return audio.transcript
    if audio is not None:
        raise ChatRequestError(
            f"{where}.audio: the audio reply {audio.id!r} cannot be looked up (this server "
            "keeps no audio); send the reply's words with it: its transcript as content, "
            "or the reply message as it came (its audio carries the transcript)",
            param=f"{where}.audio",
            error_code="unsupported_value",
        )
    if text is None:
        raise ChatRequestError(
            f"{where}: an assistant message needs content (the reply's words)",
            param=f"{where}.content",
            error_code="missing_required_parameter",
        )
    return text


def _user_turn(
    content: str | list[TextPart | InputAudioPart], where: str, max_bytes: int
) -> list[TurnPart]:
    if isinstance(content, str):
        return [TurnPart(text=content)]
    turn: list[TurnPart] = []
    for j, part in enumerate(content):
        if isinstance(part, TextPart):
            turn.append(TurnPart(text=part.text))
            continue
        param = f"{where}.content[{j}].input_audio"
        audio, rate = _input_audio(part, param, max_bytes)
        turn.append(TurnPart(audio=audio, sample_rate=rate))
    if not turn:
        raise ChatRequestError(
            f"{where}: the message has no content; send text or input_audio parts",
            param=f"{where}.content",
            error_code="invalid_value",
        )
    return turn


def _input_audio(part: InputAudioPart, param: str, max_bytes: int) -> tuple[torch.Tensor, int]:
    """An audio part's samples and rate."""
    payload = part.input_audio
    if payload.format == "pcm16":
        try:
            return decode_audio(payload.data, "audio/pcm", max_bytes=max_bytes), OUTPUT_RATE
        except AudioPayloadError as exc:
            raise ChatRequestError(str(exc), param=f"{param}.data", error_code=exc.reason) from None
    if payload.format != "wav":
        raise ChatRequestError(
            f'input_audio.format "{payload.format}" is not supported; send "wav" (any PCM '
            'WAV) or "pcm16" (24 kHz mono PCM16)',
            param=f"{param}.format",
            error_code="unsupported_value",
        )
    try:
        raw = base64.b64decode(payload.data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ChatRequestError(
            f"input_audio.data is not valid base64 ({exc}): encode the WAV file's bytes "
            "with standard base64",
            param=f"{param}.data",
            error_code="invalid_base64",
        ) from None
    if len(raw) > max_bytes:
        raise ChatRequestError(
            f"input_audio.data is {len(raw)} bytes, over the limit of {max_bytes} bytes "
            "per audio part (max_append_bytes): send shorter audio",
            status=413,
            param=f"{param}.data",
            error_code="too_large",
        )
    try:
        return decode_wav(raw)
    except AudioFormatError as exc:
        raise ChatRequestError(
            str(exc), param=f"{param}.data", error_code="invalid_audio"
        ) from None
