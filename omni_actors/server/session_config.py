"""``SessionSettings``: a realtime session's settings, and how ``session.update`` changes
them.

The GA form (``session.audio.input.format``, ``output_modalities`` …) and the beta flat
form (``input_audio_format: "pcm16"``, ``modalities``, ``voice`` …) update the same
settings; an update changes only what it names, and is checked whole before any of it
applies, so a bad update leaves the session as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

import msgspec

from omni_actors.protocols.realtime_client import (
    AudioFormat,
    AudioInputConfig,
    AudioOutputConfig,
    FunctionTool,
    ResponseParams,
    SessionConfig,
    TokenLimits,
    ToolChoice,
    TranscriptionConfig,
    Truncation,
    TurnDetection,
)
from omni_actors.protocols.realtime_server import (
    AudioInputState,
    AudioOutputState,
    AudioState,
    FunctionToolState,
    RealtimeSession,
    TranscriptionState,
    TruncationState,
    TurnDetectionState,
)
from omni_actors.server.audio_format import BETA_FORMATS, AudioFormatName, format_rate
from omni_actors.server.model_list import MODEL_NOT_FOUND, unknown_model
from omni_actors.server.request_error import RequestError
from omni_actors.server.truncation import RetentionRatio
from omni_actors.server.turn_models import SILERO_VAD, SMART_TURN, silero_model, smart_turn_model
from omni_actors.server.voices import ANY_VOICE, UnknownVoiceError, VoiceMap

__all__ = [
    "ENERGY_VAD",
    "OPENAI_TRANSCRIPTION_MODELS",
    "Eagerness",
    "ResponseSettings",
    "SessionSettings",
    "SettingError",
    "TranscriptionSettings",
    "VadSettings",
]

Modality = Literal["text", "audio"]
Eagerness = Literal["low", "medium", "high", "auto"]
ENERGY_VAD = "frame-energy"
"""The name ``turn_detection.detector`` shows for the fallback VAD (``vad.py``)."""
_SESSION_LIFETIME_S = 30 * 60
T = TypeVar("T")


class SettingError(RequestError):
    """A setting the server cannot apply; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message, realtime_code="invalid_value", param=param)


@dataclass(frozen=True, slots=True)
class VadSettings:
    """Turn detection: ``server_vad`` or ``semantic_vad`` (OpenAI's defaults)."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    eagerness: Eagerness = "auto"
    """``semantic_vad`` only (``turns.EAGERNESS``)."""
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    """No speech for this long after a reply has played: the silence is committed and a
    reply follows (``input_audio_buffer.timeout_triggered``); None: never."""


OPENAI_TRANSCRIPTION_MODELS = (
    "whisper-1",
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-transcribe-2025-12-15",
    "gpt-transcribe",
    "gpt-live-transcribe",
    "gpt-realtime-whisper",
)
"""OpenAI's transcription models, each taken as a name of the pipeline's transcriber (as
a client written for OpenAI names one of them); diarization is not among them."""


@dataclass(frozen=True, slots=True)
class TranscriptionSettings:
    """Transcription of the user's audio: the model asked for, ``language``, ``prompt``."""

    model: str
    language: str | None = None
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseSettings:
    """What one response is asked for: the session's settings with its overrides.

    ``voice`` is the name the client set (what events show); ``speaker`` the model's
    speaker it names (what the pipeline is asked for).
    """

    modalities: tuple[Modality, ...]
    output_format: AudioFormatName
    voice: str | None
    max_tokens: int | None
    temperature: float | None
    instructions: str | None
    """The response's own instructions (``response.instructions``), for its reply alone;
    None: the session's hold."""
    speaker: str | None = None
    tools: tuple[FunctionToolState, ...] | None = None
    """The tools offered to this reply alone (``response.tools`` / ``tool_choice``);
    None: the session's."""


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """A session's settings (see the module docstring)."""

    id: str
    model: str
    modalities: tuple[Modality, ...] = ("audio",)
    instructions: str = ""
    input_format: AudioFormatName = "audio/pcm"
    output_format: AudioFormatName = "audio/pcm"
    voice: str | None = None
    vad: VadSettings | None = VadSettings()
    max_tokens: int | None = None
    temperature: float | None = None
    created_at: float = 0.0
    tools: tuple[FunctionToolState, ...] = ()
    tool_choice: Literal["auto", "none"] = "auto"
    transcription: TranscriptionSettings | None = None
    truncation: RetentionRatio | None = None
    """None: the whole conversation is kept (``"auto"``/``"disabled"``)."""

    @property
    def offered_tools(self) -> tuple[FunctionToolState, ...]:
        """The tools the model may call now (none with ``tool_choice: "none"``)."""
        return self.tools if self.tool_choice == "auto" else ()

    def updated(
        self,
        config: SessionConfig,
        voices: VoiceMap = ANY_VOICE,
        transcribers: tuple[str, ...] = (),
    ) -> SessionSettings:
        """These settings with ``config`` applied; a voice must be one of ``voices``.

        ``transcribers``: the transcription models the server serves (the names of the
        pipeline's transcriber; none: it has none); OpenAI's names are taken for it.

        Raises:
            SettingError: a value the server does not support (the settings are unchanged).
        """
        new = self
        refusal = unknown_model(config.model, self.model)
        if refusal is not None:
            raise RequestError(refusal, realtime_code=MODEL_NOT_FOUND, param="session.model")
        modalities = _first(config.output_modalities, config.modalities)
        if modalities is not None:
            new = replace(new, modalities=_modalities(modalities, "session.output_modalities"))
        if config.instructions is not None:
            new = replace(new, instructions=config.instructions)
        audio_in = config.audio.input if config.audio is not None else None
        audio_out = config.audio.output if config.audio is not None else None
        fmt = _either_format(audio_in, config.input_audio_format, "input")
        if fmt is not None:
            new = replace(new, input_format=fmt)
        fmt = _either_format(audio_out, config.output_audio_format, "output")
        if fmt is not None:
            new = replace(new, output_format=fmt)
        _speed(audio_out.speed if audio_out is not None else None, "session.audio.output.speed")
        _speed(config.speed, "session.speed")
        voice = audio_out.voice if audio_out is not None else None
        voice = voice or config.voice
        if voice is not None:
            _voice(voice, "session.audio.output.voice", voices)  # shown as the client sent it
            new = replace(new, voice=voice)
        turn_detection = config.turn_detection
        if audio_in is not None and audio_in.turn_detection is not msgspec.UNSET:
            turn_detection = audio_in.turn_detection
        if turn_detection is not msgspec.UNSET:
            new = replace(new, vad=_vad(turn_detection, new.vad))
        limit: int | Literal["inf"] | None = _first(
            config.max_output_tokens, config.max_response_output_tokens
        )
        if limit is not None:
            new = replace(new, max_tokens=_max_tokens(limit, "session.max_output_tokens"))
        if config.temperature is not None:
            new = replace(new, temperature=_temperature(config.temperature))
        if config.truncation is not None:
            new = replace(new, truncation=_truncation(config.truncation))
        if config.tools is not None:
            new = replace(new, tools=_tools(config.tools, "session.tools"))
        if config.tool_choice is not None:
            new = replace(new, tool_choice=_tool_choice(config.tool_choice, "session.tool_choice"))
        param = "session.audio.input.transcription"
        transcription = audio_in.transcription if audio_in is not None else msgspec.UNSET
        if transcription is msgspec.UNSET:
            param, transcription = (
                "session.input_audio_transcription",
                config.input_audio_transcription,
            )
        if transcription is not msgspec.UNSET:
            new = replace(new, transcription=_transcription(transcription, transcribers, param))
        return new

    def for_response(
        self, params: ResponseParams | None, voices: VoiceMap = ANY_VOICE
    ) -> ResponseSettings:
        """The settings of a response, with ``response.create``'s overrides; a voice
        must be one of ``voices``, and names the speaker it maps to there.

        Raises:
            SettingError: an override the server does not support, or one that would
                offer no tools while the session offers some (see :meth:`_own_tools`).
        """
        base = ResponseSettings(
            modalities=self.modalities,
            output_format=self.output_format,
            voice=self.voice,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            instructions=None,
            speaker=None
            if self.voice is None
            else _voice(self.voice, "session.audio.output.voice", voices),
        )
        if params is None:
            return base
        base = replace(base, tools=self._own_tools(params))
        modalities = _first(params.output_modalities, params.modalities)
        if modalities is not None:
            base = replace(base, modalities=_modalities(modalities, "response.output_modalities"))
        if params.instructions and params.instructions != self.instructions:
            base = replace(base, instructions=params.instructions)
        limit: int | Literal["inf"] | None = _first(
            params.max_output_tokens, params.max_response_output_tokens
        )
        if limit is not None:
            base = replace(base, max_tokens=_max_tokens(limit, "response.max_output_tokens"))
        output: AudioOutputConfig | None = params.audio.output if params.audio else None
        _speed(output.speed if output else None, "response.audio.output.speed")
        voice = (output.voice if output else None) or params.voice
        if voice is not None:
            param = "response.audio.output.voice"
            base = replace(base, voice=_voice(voice, param), speaker=_voice(voice, param, voices))
        if output is not None and output.format is not None:
            fmt = _format(output.format, "response.audio.output.format")
            base = replace(base, output_format=fmt)
        if params.temperature is not None:
            base = replace(base, temperature=_temperature(params.temperature))
        return base

    def _own_tools(self, params: ResponseParams) -> tuple[FunctionToolState, ...] | None:
        """The tools a response offers of its own (``response.tools`` and
        ``tool_choice`` over the session's); None when they are the session's.

        A reply sees the conversation's system turn, which offers the session's tools:
        its own are offered after it, for it alone, but the session's cannot be taken
        back for one reply. A response that would offer none while the session offers
        some is refused.

        Raises:
            SettingError: a tool or choice the server does not support, or no tools
                while the session offers some.
        """
        if params.tools is None and params.tool_choice is None:
            return None
        tools = self.tools if params.tools is None else _tools(params.tools, "response.tools")
        choice = (
            self.tool_choice
            if params.tool_choice is None
            else _tool_choice(params.tool_choice, "response.tool_choice")
        )
        offered = tools if choice == "auto" else ()
        if offered == self.offered_tools:
            return None
        if not offered:
            raise SettingError(
                "a response cannot offer no tools while the session offers some (the "
                "conversation's system turn holds them): update the session's tools or "
                'tool_choice ("none") instead',
                "response.tool_choice" if choice == "none" else "response.tools",
            )
        return offered

    def describe(self) -> RealtimeSession:
        """The settings as ``session.created``/``session.updated`` show them."""
        vad = self.vad
        return RealtimeSession(
            id=self.id,
            model=self.model,
            output_modalities=list(self.modalities),
            instructions=self.instructions,
            audio=AudioState(
                input=AudioInputState(
                    format=describe_format(self.input_format),
                    turn_detection=None if vad is None else _describe_vad(vad),
                    transcription=None
                    if self.transcription is None
                    else TranscriptionState(
                        model=self.transcription.model,
                        language=self.transcription.language,
                        prompt=self.transcription.prompt,
                    ),
                ),
                output=AudioOutputState(
                    format=describe_format(self.output_format), voice=self.voice
                ),
            ),
            max_output_tokens="inf" if self.max_tokens is None else self.max_tokens,
            expires_at=int((self.created_at or time.time()) + _SESSION_LIFETIME_S),
            tools=list(self.tools),
            tool_choice=self.tool_choice,
            # What runs: without a retention ratio the server drops no turns (_truncation).
            truncation="disabled"
            if self.truncation is None
            else TruncationState(
                retention_ratio=self.truncation.ratio,
                token_limits=TokenLimits(post_instructions=self.truncation.post_instructions),
            ),
        )


def _describe_vad(vad: VadSettings) -> TurnDetectionState:
    if vad.type == "semantic_vad":
        return TurnDetectionState(
            type=vad.type,
            eagerness=vad.eagerness,
            create_response=vad.create_response,
            interrupt_response=vad.interrupt_response,
            detector=SMART_TURN,
        )
    return TurnDetectionState(
        type=vad.type,
        threshold=vad.threshold,
        prefix_padding_ms=vad.prefix_padding_ms,
        silence_duration_ms=vad.silence_duration_ms,
        create_response=vad.create_response,
        interrupt_response=vad.interrupt_response,
        idle_timeout_ms=vad.idle_timeout_ms,
        # What runs: Silero VAD when installed (extra "turns"), else the energy VAD.
        detector=ENERGY_VAD if silero_model() is None else SILERO_VAD,
    )


def _truncation(truncation: Truncation) -> RetentionRatio | None:
    """``"auto"`` and ``"disabled"``: the whole conversation is kept (shown as
    ``"disabled"``, what runs: the server is not told the model's context length, so
    ``"auto"`` has no limit to act on); a retention ratio with its own limit."""
    param = "session.truncation"
    if truncation in ("auto", "disabled"):
        return None
    if isinstance(truncation, str) or truncation.type != "retention_ratio":
        named = truncation if isinstance(truncation, str) else f"a {truncation.type} truncation"
        raise SettingError(
            f'truncation {named!r} is not supported: send "auto", "disabled" or '
            '{"type": "retention_ratio", ...}',
            param,
        )
    ratio = truncation.retention_ratio
    if isinstance(ratio, bool) or not 0.0 <= ratio <= 1.0:
        raise SettingError(
            f"retention_ratio must be in [0, 1], got {ratio!r}", param + ".retention_ratio"
        )
    limits = truncation.token_limits
    limit = limits.post_instructions if limits is not None else None
    if limit is None:
        raise SettingError(
            "a retention_ratio truncation needs token_limits.post_instructions here: the "
            "server is not told the model's context length, so it cannot tell when the "
            "conversation passes it",
            param + ".token_limits.post_instructions",
        )
    if isinstance(limit, bool) or limit < 1:
        raise SettingError(
            f"post_instructions must be >= 1, got {limit!r}",
            param + ".token_limits.post_instructions",
        )
    return RetentionRatio(ratio=float(ratio), post_instructions=limit)


def _tools(tools: list[FunctionTool], param: str) -> tuple[FunctionToolState, ...]:
    checked: list[FunctionToolState] = []
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        if tool.type != "function":
            raise SettingError(
                f"tools of type {tool.type!r} are not supported; send function tools",
                where + ".type",
            )
        if not tool.name:
            raise SettingError("a function tool needs a name", where + ".name")
        if any(t.name == tool.name for t in checked):
            raise SettingError(f"two tools are named {tool.name!r}", where + ".name")
        checked.append(
            FunctionToolState(
                name=tool.name, description=tool.description, parameters=tool.parameters
            )
        )
    return tuple(checked)


def _tool_choice(choice: ToolChoice, param: str) -> Literal["auto", "none"]:
    if choice in ("auto", "none"):
        return choice  # type: ignore[return-value]
    named = choice if isinstance(choice, str) else f"a {choice.type} choice"
    raise SettingError(
        f"tool_choice {named!r} is not supported: the model decides whether to call a "
        'tool; use "auto" (or "none" to offer none)',
        param,
    )


def _first(ga: T | None, beta: T | None) -> T | None:
    """The GA field if given, else its beta alias (0 and [] count as given)."""
    return ga if ga is not None else beta


def describe_format(name: AudioFormatName) -> AudioFormat:
    """The GA description of an audio format."""
    return AudioFormat(type=name, rate=format_rate(name) if name == "audio/pcm" else None)


def _format(fmt: AudioFormat, param: str) -> AudioFormatName:
    name = BETA_FORMATS.get(fmt.type, fmt.type)
    if name not in ("audio/pcm", "audio/pcmu", "audio/pcma"):
        raise SettingError(
            f"unsupported audio format {fmt.type!r}: use audio/pcm, audio/pcmu or audio/pcma",
            param + ".type",
        )
    if fmt.rate is not None and fmt.rate != format_rate(name):  # type: ignore[arg-type]
        raise SettingError(
            f"{name} is served at {format_rate(name)} Hz, not {fmt.rate}",  # type: ignore[arg-type]
            param + ".rate",
        )
    return name  # type: ignore[return-value]


def _either_format(
    ga: AudioInputConfig | AudioOutputConfig | None, beta: str | None, side: str
) -> AudioFormatName | None:
    """The format a ``session.update`` sets for one side: the GA nested form, else the
    beta flat name, else None."""
    if ga is not None and ga.format is not None:
        return _format(ga.format, f"session.audio.{side}.format")
    if beta is not None:
        return _beta_format(beta, f"session.{side}_audio_format")
    return None


def _beta_format(name: str, param: str) -> AudioFormatName:
    if name not in BETA_FORMATS:
        raise SettingError(
            f"unsupported audio format {name!r}: use pcm16, g711_ulaw or g711_alaw", param
        )
    return BETA_FORMATS[name]


def _modalities(modalities: list[Modality], param: str) -> tuple[Modality, ...]:
    if not modalities:
        raise SettingError('output_modalities must be ["audio"] or ["text"]', param)
    # Audio output always carries its transcript: ["text", "audio"] is ["audio"].
    return ("audio",) if "audio" in modalities else ("text",)


def _voice(voice: str, param: str, voices: VoiceMap = ANY_VOICE) -> str:
    """``voice`` checked, as the speaker it names in ``voices``."""
    if not voice:
        raise SettingError("voice must be a non-empty name", param)
    try:
        return voices.speaker(voice)
    except UnknownVoiceError as exc:
        raise SettingError(str(exc), param) from None


def _speed(speed: float | None, param: str) -> None:
    """Refuse a playback speed other than 1: the audio is the model's, at its pace."""
    if speed is not None and speed != 1.0:
        raise SettingError(
            f"speed {speed:g} is not supported: replies are spoken at the model's own "
            "pace; send 1.0 or leave it out",
            param,
        )


def _max_tokens(limit: int | Literal["inf"], param: str) -> int | None:
    if limit == "inf":
        return None
    if isinstance(limit, bool) or limit < 1:
        raise SettingError(f'max_output_tokens must be >= 1 or "inf", got {limit!r}', param)
    return limit


def _temperature(value: float) -> float:
    if not value >= 0:
        raise SettingError(f"temperature must be >= 0, got {value}", "session.temperature")
    return float(value)


def _transcription(
    config: TranscriptionConfig | None, served: tuple[str, ...], param: str
) -> TranscriptionSettings | None:
    """The transcription a ``session.update`` asks for (None: off), checked against the
    models the server serves (``served``: the first is its own name)."""
    if config is None:
        return None
    if not served:
        raise SettingError(
            "this server transcribes nothing: its pipeline has no transcriber "
            "(outputs.transcript); set transcription to null",
            param,
        )
    model = config.model or served[0]
    if model not in served and model not in OPENAI_TRANSCRIPTION_MODELS:
        names = ", ".join([*served, *OPENAI_TRANSCRIPTION_MODELS])
        raise SettingError(
            f"transcription model {model!r} is not served here; use one of: {names}",
            param + ".model",
        )
    language = config.language or None
    if language is not None and not (2 <= len(language) <= 3 and language.isalpha()):
        raise SettingError(
            f"language must be an ISO-639-1 code such as 'en', got {language!r}",
            param + ".language",
        )
    return TranscriptionSettings(model=model, language=language, prompt=config.prompt or None)


def _vad(detection: TurnDetection | None, current: VadSettings | None) -> VadSettings | None:
    if detection is None:
        return None
    param = "session.audio.input.turn_detection"
    if detection.type not in ("server_vad", "semantic_vad"):
        raise SettingError(
            f"unsupported turn_detection type {detection.type!r}: use server_vad, "
            "semantic_vad or null",
            param + ".type",
        )
    if detection.type == "semantic_vad":
        return _semantic_vad(detection, current, param)
    if detection.eagerness is not None:
        raise SettingError(
            "eagerness is a semantic_vad setting; server_vad takes threshold, "
            "prefix_padding_ms and silence_duration_ms",
            param + ".eagerness",
        )
    # An update of the type in force changes what it names; another type starts anew.
    base = current if current is not None and current.type == "server_vad" else VadSettings()
    vad = replace(
        base,
        threshold=base.threshold if detection.threshold is None else detection.threshold,
        prefix_padding_ms=base.prefix_padding_ms
        if detection.prefix_padding_ms is None
        else detection.prefix_padding_ms,
        silence_duration_ms=base.silence_duration_ms
        if detection.silence_duration_ms is None
        else detection.silence_duration_ms,
        create_response=base.create_response
        if detection.create_response is None
        else detection.create_response,
        interrupt_response=base.interrupt_response
        if detection.interrupt_response is None
        else detection.interrupt_response,
        # null turns the timeout off; left out, it stays as it was.
        idle_timeout_ms=base.idle_timeout_ms
        if detection.idle_timeout_ms is msgspec.UNSET
        else detection.idle_timeout_ms,
    )
    if not 0.0 <= vad.threshold <= 1.0:
        raise SettingError(
            f"threshold must be in [0, 1], got {vad.threshold}", param + ".threshold"
        )
    if not 0 <= vad.prefix_padding_ms <= 10_000:
        raise SettingError(
            f"prefix_padding_ms must be in [0, 10000], got {vad.prefix_padding_ms}",
            param + ".prefix_padding_ms",
        )
    if not 10 <= vad.silence_duration_ms <= 10_000:
        raise SettingError(
            f"silence_duration_ms must be in [10, 10000], got {vad.silence_duration_ms}",
            param + ".silence_duration_ms",
        )
    if vad.idle_timeout_ms is not None and not 0 < vad.idle_timeout_ms <= 3_600_000:
        raise SettingError(
            f"idle_timeout_ms must be in [1, 3600000], got {vad.idle_timeout_ms}",
            param + ".idle_timeout_ms",
        )
    return vad


def _semantic_vad(detection: TurnDetection, current: VadSettings | None, param: str) -> VadSettings:
    """``semantic_vad``: Silero VAD hears speech, Smart Turn judges each pause; refused
    when they are not installed, rather than served as something else."""
    if silero_model() is None or smart_turn_model() is None:
        raise SettingError(
            "semantic_vad needs Silero VAD and Smart Turn, which are not installed here "
            "(pip install 'omni-actors[semantic-vad]'); use server_vad or null",
            param + ".type",
        )
    for name in ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"):
        if getattr(detection, name) not in (None, msgspec.UNSET):
            raise SettingError(
                f"{name} is a server_vad setting; semantic_vad takes eagerness "
                "(low, medium, high or auto)",
                f"{param}.{name}",
            )
    base = (
        current
        if current is not None and current.type == "semantic_vad"
        else VadSettings(type="semantic_vad")
    )
    eagerness = base.eagerness if detection.eagerness is None else detection.eagerness
    if eagerness not in ("low", "medium", "high", "auto"):
        raise SettingError(
            f"eagerness must be low, medium, high or auto, got {eagerness!r}",
            param + ".eagerness",
        )
    return replace(
        base,
        eagerness=eagerness,  # type: ignore[arg-type]  # checked above
        create_response=base.create_response
        if detection.create_response is None
        else detection.create_response,
        interrupt_response=base.interrupt_response
        if detection.interrupt_response is None
        else detection.interrupt_response,
    )
