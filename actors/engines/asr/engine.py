"""``AsrEngine`` (kind ``transformers.asr``): a pipeline's transcriber on any transformers
speech-to-text checkpoint.

It serves the transcriber stage (:mod:`omni_actors.actors.engines.transcriber_ports`):
the caller's audio of each user turn is gathered as it arrives, and once the turn is
committed the checkpoint transcribes it on the engine's model thread
(:class:`~omni_actors.actors.engines.torch_engine.TorchEngine`). The text streams out
as it is decoded: each decode step that adds to it yields the piece it adds
(``transcript_delta``), then the turn ends with its whole ``transcript``.
``model:`` names the checkpoint: a directory or a Hub repo id holding what
``AutoProcessor`` and ``AutoModelForSpeechSeq2Seq`` load (Whisper, or any other
sequence-to-sequence speech model), or ``tiny-whisper`` (the default: toy size, seeded
random weights, written locally, on first use if it was not prepared).

Input is read while a turn is being transcribed, so the stage takes the caller's chunks
as they come (its credits never hold up the caller's input, which the entry stage
shares) and the turns queue here, in order. A turn that fails (an unknown language, a
model error) yields its error instead of a transcript; the next turn goes on. A turn is
transcribed from its first ``max_turn_s`` seconds: Whisper's window is 30 s.

The pieces are the transcript decoded so far, less what was yielded before: a piece is
held while the text ends in a character still being spelled (a byte-level token's half
of one) or in whitespace (the transcript is stripped), so the pieces join to the whole
transcript. Should a tokenizer rewrite earlier text as later tokens come (it does not
for Whisper's), no more pieces go out, and the transcript still holds the whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field

from omni_actors.actors.engines.asr.family import DEFAULT_TRANSCRIBER
from omni_actors.actors.engines.contract import TURN_FIELD, Fields, Rule
from omni_actors.actors.engines.torch_engine import (
    PRETRAINED_LOCK,
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
    TRANSCRIPT_DELTA_FIELD,
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


@dataclass
class _OpenTurn:
    """The user turn being gathered: its audio as it arrives, and its item."""

    parts: list[torch.Tensor] = field(default_factory=list)
    item: str = ""

    def take(self, fields: Fields, settings: _Settings) -> None:
        """Take a chunk's transcription fields: the language and prompt into
        ``settings`` (an empty one unsets it), the turn's item, its audio."""
        for name in (LANGUAGE_FIELD, PROMPT_FIELD):
            value = fields.get(name)
            if isinstance(value, str):
                setattr(settings, name, value or None)
        named = fields.get(ITEM_FIELD)
        if isinstance(named, str):
            self.item = named
        audio = fields.get("audio")
        if isinstance(audio, torch.Tensor) and audio.numel():
            self.parts.append(audio)

    def close(self, settings: _Settings) -> _Turn | None:
        """Commit the turn: what to transcribe, under ``settings`` as they are now (None
        without audio); the next turn opens empty."""
        turn = None
        if self.parts:
            audio = torch.cat([p.reshape(-1).to(torch.float32) for p in self.parts])
            turn = _Turn(self.item, audio, _Settings(settings.language, settings.prompt))
        self.drop()
        return turn

    def drop(self) -> None:
        """Drop the turn (a ``clear``): the next one opens empty."""
        self.parts, self.item = [], ""


class AsrEngine(TorchEngine):
    """Transcripts of the caller's user turns (see the module docstring)."""

    kind = "transformers.asr"
    Args = AsrArgs
    inputs: ClassVar[dict[str, Rule]] = dict(TRANSCRIBER_INPUTS)
    outputs: ClassVar[dict[str, Rule]] = dict(TRANSCRIBER_OUTPUTS)
    streams_input = True

    def __init__(self, args: AsrArgs, path: Path | None = None) -> None:
        """``path``: the checkpoint, when a subclass locates it (else ``args`` name it)."""
        super().__init__(path or _checkpoint(args), "transcriber", args.device)
        self._args = args
        self._processor: Any = None
        self._model: Any = None
        self._rate = args.sample_rate
        self._settings: dict[SessionKey, _Settings] = {}
        self._aborts: dict[SessionKey, AbortSignal] = {}

    def _load(self, path: Path) -> None:
        from omni_actors.actors.engines.asr.hf import AutoModelForSpeechSeq2Seq, AutoProcessor
        from omni_actors.actors.engines.qwen3_omni.configs import quiet_transformers

        with PRETRAINED_LOCK, quiet_transformers():  # no weight-loading bar on every start
            self._processor = AutoProcessor.from_pretrained(path)  # type: ignore[no-untyped-call,unused-ignore]
            model = AutoModelForSpeechSeq2Seq.from_pretrained(path, use_safetensors=True)
        # The engine bounds a transcript by its own argument, not the checkpoint's.
        bound = model.generation_config
        if model.config.model_type == "whisper":
            # Whisper's generate fills an unset max_length with transformers' default (20)
            # and then warns on every transcript that max_new_tokens overrides it; its
            # max_length counts from the end of the decoder's prompt (it adds the prompt's
            # length), so it bounds the transcript's tokens alone, with nothing to warn of.
            bound.max_new_tokens, bound.max_length = None, self._args.max_transcript_tokens
        else:
            bound.max_new_tokens, bound.max_length = self._args.max_transcript_tokens, None
        self._model = model.to(self.device).eval()
        extractor = getattr(self._processor, "feature_extractor", self._processor)
        self._rate = int(getattr(extractor, "sampling_rate", self._args.sample_rate))

    def _transcribe(self, turn: _Turn, pieces: _Pieces) -> str:
        """Model thread: ``turn``'s transcript; ``pieces`` is told each token decoded."""
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
            ids = model.generate(inputs, streamer=pieces, **kwargs)
        prompt = kwargs.get("prompt_ids")
        # Some transformers releases return the prompt ahead of the transcript, others
        # the transcript alone; the prompt opens with <|startofprev|>, which no
        # transcript decodes, so a leading prompt is told apart from the text.
        if prompt is not None and torch.equal(ids[0, : prompt.numel()], prompt):
            ids = ids[:, prompt.numel() :]
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
                async for output in self._turn(turn, abort):
                    yield output
                if abort.aborted:
                    break
            if reader.done():
                reader.result()  # a broken input stream fails the segment
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _turn(self, turn: _Turn, abort: AbortSignal) -> AsyncIterator[Fields]:
        """``turn``'s outputs: its pieces as they are decoded, then its transcript (or
        its error: this turn fails, the others go on); nothing more once aborted."""
        told: asyncio.Queue[str | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        pieces = _Pieces(
            self._decode, lambda piece: loop.call_soon_threadsafe(told.put_nowait, piece)
        )
        job = asyncio.ensure_future(self.call(self._transcribe, turn, pieces))
        # Queued after the pieces the thread told: their callbacks were scheduled first.
        job.add_done_callback(lambda _: told.put_nowait(None))
        try:
            while (piece := await abort.until(told.get())) is not None:
                yield {ITEM_FIELD: turn.item, TRANSCRIPT_DELTA_FIELD: piece}
            if abort.aborted:
                return
            text = await job
        except Exception as exc:
            yield {ITEM_FIELD: turn.item, TRANSCRIPT_ERROR_FIELD: f"{exc}"}
            return
        finally:
            job.cancel()  # once aborted its result is dropped; the thread finishes the call
        rest = text[len(pieces.said) :] if text.startswith(pieces.said) else ""
        if rest:
            yield {ITEM_FIELD: turn.item, TRANSCRIPT_DELTA_FIELD: rest}
        yield {ITEM_FIELD: turn.item, TRANSCRIPT_FIELD: text}

    def _decode(self, ids: list[int]) -> str:
        """Model thread: the text of token ids (special tokens left out)."""
        text: str = self._processor.batch_decode([ids], skip_special_tokens=True)[0]
        return text

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


class _Pieces:
    """A ``generate`` streamer (``put`` each step's tokens, then ``end``): tells each
    piece the decoded transcript adds (see the module docstring). Runs in the model
    thread; ``tell`` hands a piece to the event loop.

    Attributes:
        said: the pieces told so far, joined.
    """

    def __init__(self, decode: Callable[[list[int]], str], tell: Callable[[str], object]) -> None:
        self._decode = decode
        self._tell = tell
        self._ids: list[int] = []
        self._prompt = True  # the first ``put`` is the decoder's prompt, not the text
        self.said = ""

    def put(self, value: torch.Tensor) -> None:
        """One decode step's token (the first call: the decoder's prompt)."""
        if self._prompt:
            self._prompt = False
            return
        self._ids += [int(t) for t in value.reshape(-1).tolist()]
        text = self._decode(self._ids).lstrip()
        if text.endswith("\ufffd"):
            return  # a character split over tokens: wait for its end
        text = text.rstrip()
        if len(text) > len(self.said) and text.startswith(self.said):
            piece, self.said = text[len(self.said) :], text
            self._tell(piece)

    def end(self) -> None:
        """Decoding ended (the engine yields what is left with the transcript)."""


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
    turn = _OpenTurn()

    def commit() -> None:
        if (closed := turn.close(settings)) is not None:
            turns.put_nowait(closed)

    try:
        while (fields := await abort.next_input(inputs)) is not None:
            mark = fields.get(TURN_FIELD)
            if mark == "commit":
                commit()
            elif mark == "clear":
                turn.drop()
            elif mark:
                continue  # truncate, reply: about the assistant's turns
            turn.take(fields, settings)
        commit()  # the segment's end commits what is open
    finally:
        turns.put_nowait(None)
