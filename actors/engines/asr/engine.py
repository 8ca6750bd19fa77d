"""``AsrEngine`` (kind ``transformers.asr``): a pipeline's transcriber on any transformers
speech-to-text checkpoint.

It serves the transcriber stage (:mod:`omni_actors.actors.engines.transcriber_ports`):
the caller's audio of each user turn is gathered as it arrives, and once the turn is
committed the checkpoint transcribes it on the engine's model thread
(:class:`~omni_actors.actors.engines.torch_engine.TorchEngine`), one output per turn.
``model:`` names the checkpoint: a directory or a Hub repo id holding what
``AutoProcessor`` and ``AutoModelForSpeechSeq2Seq`` load (Whisper, or any other
sequence-to-sequence speech model), or ``tiny-whisper`` (the default: toy size, seeded
random weights, written locally, on first use if it was not prepared).

Input is read while a turn is being transcribed, so the stage takes the caller's chunks
as they come (its credits never hold up the caller's input, which the entry stage
shares) and the turns queue here, in order. A turn that fails (an unknown language, a
model error) yields its error instead of a transcript; the next turn goes on. A turn is
transcribed from its first ``max_turn_s`` seconds: Whisper's window is 30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field

from omni_actors.actors.engines.asr.family import DEFAULT_TRANSCRIBER
from omni_actors.actors.engines.contract import TURN_FIELD, Fields, Rule
from omni_actors.actors.engines.torch_engine import (
    AbortSignal,
    DeviceArgs,
    TorchEngine,
    release_dir,
)
from omni_actors.actors.engines.transcriber_ports import (
    ITEM_FIELD,
    LANGUAGE_FIELD,
    PROMPT_FIELD,
    TRANSCRIBER_INPUTS,
    TRANSCRIBER_OUTPUTS,
    TRANSCRIPT_ERROR_FIELD,
    TRANSCRIPT_FIELD,
)
from omni_actors.audio.resample import StreamResampler
from omni_actors.models.cache import ModelNotPreparedError, prepare
from omni_actors.models.family import WeightsArgs
from omni_actors.protocols.stage import SessionKey

__all__ = ["AsrArgs", "AsrEngine"]


class AsrArgs(WeightsArgs, DeviceArgs):
    """The transcriber's arguments (``model``, ``seed``, ``cache_dir`` locate its weights).

    Attributes:
        sample_rate: the rate of the audio it is sent: the pipeline's
            ``inputs.sample_rate`` (resampled to the checkpoint's own rate if it differs).
        max_transcript_tokens: a transcript's most tokens.
        max_turn_s: the seconds of a turn that are transcribed (its start).
    """

    sample_rate: int = Field(16000, gt=0)
    max_transcript_tokens: int = Field(128, ge=1, le=444)
    max_turn_s: float = Field(30.0, gt=0, le=30.0)


@dataclass
class _Settings:
    """A session's transcription settings, kept across its segments."""

    language: str | None = None
    prompt: str | None = None


@dataclass
class _Turn:
    """One committed user turn, waiting to be transcribed."""

    item: str
    audio: torch.Tensor
    settings: _Settings = field(default_factory=_Settings)


class AsrEngine(TorchEngine):
    """Transcripts of the caller's user turns (see the module docstring)."""

    kind = "transformers.asr"
    Args = AsrArgs
    inputs: ClassVar[dict[str, Rule]] = dict(TRANSCRIBER_INPUTS)
    outputs: ClassVar[dict[str, Rule]] = dict(TRANSCRIBER_OUTPUTS)
    streams_input = True

    def __init__(self, args: AsrArgs) -> None:
        super().__init__(_checkpoint(args), "transcriber", args.device)
        self._args = args
        self._processor: Any = None
        self._model: Any = None
        self._rate = args.sample_rate
        self._settings: dict[SessionKey, _Settings] = {}
        self._aborts: dict[SessionKey, AbortSignal] = {}

    def _load(self, path: Path) -> None:
        from omni_actors.actors.engines.asr.hf import AutoModelForSpeechSeq2Seq, AutoProcessor

        self._processor = AutoProcessor.from_pretrained(path)  # type: ignore[no-untyped-call,unused-ignore]
        model = AutoModelForSpeechSeq2Seq.from_pretrained(path, use_safetensors=True)
        # The engine bounds a transcript by its own argument, not the checkpoint's.
        model.generation_config.max_length = None
        model.generation_config.max_new_tokens = self._args.max_transcript_tokens
        self._model = model.to(self.device).eval()
        extractor = getattr(self._processor, "feature_extractor", self._processor)
        self._rate = int(getattr(extractor, "sampling_rate", self._args.sample_rate))

    def _transcribe(self, turn: _Turn) -> str:
        """Model thread: ``turn``'s transcript."""
        audio = turn.audio
        if self._rate != self._args.sample_rate:
            resampler = StreamResampler(self._args.sample_rate, self._rate)
            audio = torch.cat((resampler.push(audio), resampler.flush()))
        audio = audio[: int(self._args.max_turn_s * self._rate)]
        processor, model = self._processor, self._model
        features = processor(audio.numpy(), sampling_rate=self._rate, return_tensors="pt")
        kwargs: dict[str, Any] = {}
        if model.config.model_type == "whisper":
            if turn.settings.language:
                kwargs["language"] = turn.settings.language
            if turn.settings.prompt:
                kwargs["prompt_ids"] = torch.as_tensor(
                    processor.get_prompt_ids(turn.settings.prompt)
                ).to(self.device)
        elif turn.settings.language or turn.settings.prompt:
            raise ValueError(
                f"a {model.config.model_type} checkpoint takes no language or prompt; "
                "leave them unset"
            )
        inputs = features["input_features"].to(self.device, model.dtype)
        with torch.inference_mode():
            ids = model.generate(inputs, **kwargs)
        if "prompt_ids" in kwargs:  # Whisper returns the prompt ahead of the transcript
            ids = ids[:, kwargs["prompt_ids"].numel() :]
        text: str = processor.batch_decode(ids, skip_special_tokens=True)[0]
        return text.strip()

    async def generate(
        self, session: SessionKey, inputs: AsyncIterator[Fields]
    ) -> AsyncIterator[Fields]:
        """One output per committed turn of the segment (see the module docstring)."""
        abort = self._aborts.setdefault(session, AbortSignal())
        settings = self._settings.setdefault(session, _Settings())
        turns: asyncio.Queue[_Turn | None] = asyncio.Queue()
        reader = asyncio.create_task(_read(inputs, abort, settings, turns), name=f"asr {session}")
        try:
            while (turn := await abort.until(turns.get())) is not None:
                try:
                    text = await abort.until(self.call(self._transcribe, turn))
                except Exception as exc:  # this turn fails; the others go on
                    yield {ITEM_FIELD: turn.item, TRANSCRIPT_ERROR_FIELD: f"{exc}"}
                    continue
                if text is None:
                    break  # aborted
                yield {ITEM_FIELD: turn.item, TRANSCRIPT_FIELD: text}
            if reader.done():
                reader.result()  # a broken input stream fails the segment
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def abort(self, session: SessionKey) -> None:
        """Stop ``session``'s transcription now and forget its settings."""
        signal = self._aborts.pop(session, None)
        if signal is not None:
            signal.abort()
        self._settings.pop(session, None)

    async def release(self, session: SessionKey) -> None:
        """``session`` ended: forget its settings."""
        self._aborts.pop(session, None)
        self._settings.pop(session, None)


def _checkpoint(args: AsrArgs) -> Path:
    """The checkpoint ``args`` name; ``tiny-whisper`` is prepared here if it is not yet
    (it takes well under a second), so a pipeline that adds a transcriber needs no new
    preparation step."""
    try:
        return release_dir(DEFAULT_TRANSCRIBER, args, "transcriber")
    except ModelNotPreparedError:
        if (args.model or DEFAULT_TRANSCRIBER) != DEFAULT_TRANSCRIBER:
            raise
    prepare(DEFAULT_TRANSCRIBER, cache_dir=args.cache_dir, seed=args.seed)
    return release_dir(DEFAULT_TRANSCRIBER, args, "transcriber")


async def _read(
    inputs: AsyncIterator[Fields],
    abort: AbortSignal,
    settings: _Settings,
    turns: asyncio.Queue[_Turn | None],
) -> None:
    """Gather the segment's turns into ``turns`` as its input arrives (None: the end)."""
    parts: list[torch.Tensor] = []
    item = ""

    def commit() -> None:
        nonlocal parts, item
        if parts:
            audio = torch.cat([p.reshape(-1).to(torch.float32) for p in parts])
            turns.put_nowait(_Turn(item, audio, _Settings(settings.language, settings.prompt)))
        parts, item = [], ""

    try:
        while (fields := await abort.next_input(inputs)) is not None:
            mark = fields.get(TURN_FIELD)
            if mark == "commit":
                commit()
            elif mark == "clear":
                parts, item = [], ""
            elif mark:
                continue  # truncate, reply: about the assistant's turns
            for name in (LANGUAGE_FIELD, PROMPT_FIELD):
                value = fields.get(name)
                if isinstance(value, str):
                    setattr(settings, name, value or None)
            named = fields.get(ITEM_FIELD)
            if isinstance(named, str):
                item = named
            audio = fields.get("audio")
            if isinstance(audio, torch.Tensor) and audio.numel():
                parts.append(audio)
        commit()  # the segment's end commits what is open
    finally:
        turns.put_nowait(None)
