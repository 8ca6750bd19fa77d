"""``SynthesizerEngine`` (kind ``cascade.tts``): Sesame CSM as a streaming synthesizer.

Input: the reply's ``text`` as the LLM writes it. The engine cuts it into phrases as it
arrives (:class:`~.phrases.PhrasePolicy`: the first at a clause or after a few words,
then sentences), and speaks each phrase as soon as it is whole, while the text goes on
arriving: the first frames leave long before the LLM's reply ends. Output: ``codes``
[1, codebooks] int64, one per 80 ms frame, for the Mimi decoder stage (the edge's
``ChunkPolicy`` windows them, as the talker's frames are windowed for code2wav).

Each phrase is CSM's turn (``[speaker]text``) fed after the phrases spoken before it in
the same reply, with their frames, so a reply is spoken as one utterance with its own
context; each reply starts a fresh one (the slot is rewound: a conversation's replies
do not grow the synthesizer's context without bound). A phrase ends at CSM's end frame
(not sent on) or after ``max_frames_per_word`` frames per word of it (text without
spaces counted in characters, :func:`~.phrases.spoken_words`).

Every forward is work on the engine's :class:`~omni_actors.actors.engines.step_loop.StepLoop`
(:class:`~.tts_model.SpeechModel`): a phrase's text is a prefill, each frame a decode
row, and sessions speaking at once share steps, as the Qwen3-Omni talker's frames do;
on a GPU a step of frames is replayed from a CUDA graph, as the talker's is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

import torch
from pydantic import Field, model_validator

from omni_actors.actors.engines.cascade.family import stage_checkpoint
from omni_actors.actors.engines.cascade.phrases import PhrasePolicy, spoken_words
from omni_actors.actors.engines.cascade.tts_model import Speech, SpeechChunk, SpeechModel
from omni_actors.actors.engines.contract import Fields, Rule, response_options
from omni_actors.actors.engines.qwen3_omni.static_decode import StaticDecodeArgs
from omni_actors.actors.engines.step_loop import Request, RequestClosedError
from omni_actors.actors.engines.stepped_engine import StepLoopArgs, SteppedTorchEngine
from omni_actors.actors.engines.torch_engine import AbortSignal, DeviceArgs
from omni_actors.errors import EngineError
from omni_actors.models.family import WeightsArgs

__all__ = ["SynthesizerArgs", "SynthesizerEngine", "SynthesizerInputError"]

FRAME_RATE: Final = 12.5
"""CSM's frames per second (Mimi's)."""


class SynthesizerArgs(WeightsArgs, DeviceArgs, StaticDecodeArgs, StepLoopArgs):
    """The synthesizer's arguments (``model``, ``seed``, ``cache_dir`` locate it).

    On a GPU a step of frames alone replays from a CUDA graph per (row bucket, span), up
    to ``max_batch`` rows, and a mixed step's depth decoder per row bucket
    (``static_cache``: None, on a GPU; False, eager), every graph captured at load with
    ``warm_graphs`` (:class:`StaticDecodeArgs`). On a CPU everything runs eagerly.

    Attributes:
        speakers: CSM's speaker ids a response's ``voice`` may name: ``0`` to
            ``speakers - 1`` (the engine's voices; the server maps OpenAI's voice names
            onto them).
        speaker: the speaker a reply is spoken by when its response names no voice.
        first_words: the first phrase ends after this many words at the latest.
        max_words: a later phrase ends after this many words at the latest.
        max_frames_per_word: a phrase's most frames, per word of it.
        max_context: the most positions of a reply's context (its phrases and frames).
    """

    speakers: int = Field(2, ge=1, le=1024)
    speaker: int = Field(0, ge=0)
    first_words: int = Field(4, ge=1)
    max_words: int = Field(30, ge=1)
    max_frames_per_word: int = Field(10, ge=1)
    max_context: int = Field(2048, ge=16)

    @model_validator(mode="after")
    def _speaker_is_a_voice(self) -> SynthesizerArgs:
        if self.speaker >= self.speakers:
            raise ValueError(
                f"speaker {self.speaker} is not one of the {self.speakers} speakers "
                f"(0 to {self.speakers - 1}): raise speakers or pick one of them"
            )
        return self


class SynthesizerInputError(EngineError, ValueError):
    """A response names a voice the synthesizer does not speak with."""


@dataclass
class _Voice:
    """One session's state: its request in the loop (its KV slot)."""

    request: Request[Any, Any]
    signal: AbortSignal | None = None
    reply: list[tuple[int, int]] | None = None
    """The last reply's phrases, each as (input chunks read through it, frames spoken
    of it): what a truncation maps heard frames onto."""


class SynthesizerEngine(SteppedTorchEngine[_Voice, Speech, torch.Tensor | None]):
    """Codec frames of streamed text (see the module docstring)."""

    kind: ClassVar[str] = "cascade.tts"
    Args: ClassVar[type[SynthesizerArgs]] = SynthesizerArgs
    inputs: ClassVar[Mapping[str, Rule]] = {"text": "concat"}
    outputs: ClassVar[Mapping[str, Rule]] = {"codes": "concat"}
    streams_input: ClassVar[bool] = True

    def __init__(self, args: SynthesizerArgs) -> None:
        self._args = args
        super().__init__(
            stage_checkpoint(args, "tts"),
            "tts",
            args.device,
            args=args,
            max_context=args.max_context,
        )

    def _load(self, path: Path) -> None:
        args = self._args
        graphs = args.graphs_on(self.device)
        self.model = SpeechModel(
            path,
            self.device,
            slots=args.max_sessions,
            max_context=args.max_context,
            max_rows=args.max_batch,
            graphs=graphs,
            warm=graphs and args.warm_graphs,
        )

    def _step(self, chunks: list[SpeechChunk]) -> list[torch.Tensor | None]:
        return self.model.step(chunks)

    @property
    def voices(self) -> list[str]:
        """The voices a response's ``voice`` may name: CSM's speaker ids, ``0`` to
        ``speakers - 1``."""
        return [str(speaker) for speaker in range(self._args.speakers)]

    @property
    def voice(self) -> str:
        """The voice a response naming none speaks with (``speaker``)."""
        return str(self._args.speaker)

    def _speaker(self, voice: str) -> int:
        if voice not in self.voices:
            raise SynthesizerInputError(
                f"unknown voice {voice!r}: this synthesizer speaks with CSM's speakers "
                f"{', '.join(self.voices)} (its speakers argument)"
            )
        return int(voice)

    @property
    def eager_steps(self) -> int | None:
        """Steps run eager for want of a graph (:attr:`SpeechModel.eager_steps`); None
        on the CPU, with ``static_cache`` off, or before the model is loaded."""
        model: SpeechModel | None = getattr(self, "model", None)
        return None if model is None else model.eager_steps

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """One reply: its text's phrases spoken as they complete (module docstring)."""
        voice = self._sessions.get(session)
        if voice is None:
            voice = self._sessions[session] = _Voice(self.loop.open(session))
        if voice.signal is not None:
            raise ValueError(f"session {session!r} is already generating")
        signal = voice.signal = AbortSignal()
        args = self._args
        policy = PhrasePolicy(args.first_words, args.max_words)
        phrases: asyncio.Queue[tuple[str, int] | None] = asyncio.Queue()
        reader = asyncio.create_task(_read(inputs, signal, policy, phrases), name=f"tts {session}")
        self.loop.rewind(voice.request, 0)  # each reply is an utterance of its own
        unfed: torch.Tensor | None = None
        said: list[tuple[int, int]] = []
        failed = False
        try:
            speaker = args.speaker
            while (cut := await signal.until(phrases.get())) is not None:
                phrase, through = cut
                if voice_option := response_options(inputs).voice:
                    speaker = self._speaker(voice_option)
                limit = args.max_frames_per_word * spoken_words(phrase)
                work = Speech(self.model.prompt(phrase, speaker), unfed)
                unfed = None
                said.append((through, 0))
                for _ in range(limit):
                    frame = await self._frame(voice, work, signal)
                    if frame is None or self.model.ends(frame):
                        break
                    said[-1] = (through, said[-1][1] + 1)
                    yield {"codes": frame[None].to(torch.int64)}
                    unfed = frame[None]
                    work = Speech(frames=unfed)
            if reader.done():
                reader.result()  # a broken input stream fails the reply
        except Exception:
            failed = True
            raise
        finally:
            if not failed and self._sessions.get(session) is voice:
                voice.reply = said  # completed, or cancelled at a yield
            voice.signal = None
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def truncate(self, session: str, kept: int) -> int:
        """The user heard the first ``kept`` frames of the last reply: the LLM outputs
        (input chunks, a token each on a stream edge) they voiced, which is what the LLM
        keeps. Every phrase whose frames were all heard keeps the chunks read through
        it; of the phrase the cut falls in, a share of its chunks as large as the share
        of its frames heard, rounded up. The reply is cut there for later truncations.

        Raises:
            ValueError: the session has no reply to truncate, or ``kept`` is negative.
        """
        voice = self._sessions.get(session)
        if voice is None or voice.reply is None:
            raise ValueError(f"synthesizer session {session!r} has no reply to truncate")
        if kept < 0:
            raise ValueError(f"cannot keep {kept} frames; pass 0 or more")
        chunks, before, left = 0, 0, kept
        heard: list[tuple[int, int]] = []
        for through, frames in voice.reply:
            if left <= 0:
                break
            if left >= frames:
                chunks, left = through, left - frames
                heard.append((through, frames))
            else:
                chunks = before + -(-(through - before) * left // frames)
                heard.append((chunks, left))
                left = 0
            before = through
        voice.reply = heard
        return chunks

    async def _frame(self, voice: _Voice, work: Speech, signal: AbortSignal) -> torch.Tensor | None:
        """The frame after ``work`` (None once aborted)."""
        decode = work.length == 1
        future = self.loop.submit(voice.request, work, work.length, decode=decode)
        try:
            outputs = await signal.until(future)
        except RequestClosedError:
            if signal.aborted:
                return None
            raise
        return None if outputs is None else outputs[-1]


async def _read(
    inputs: AsyncIterator[Fields],
    signal: AbortSignal,
    policy: PhrasePolicy,
    phrases: asyncio.Queue[tuple[str, int] | None],
) -> None:
    """Cut the reply's text into ``phrases`` as it arrives, each with the count of input
    chunks read when it was cut (None: the end)."""
    read = 0
    try:
        while (fields := await signal.next_input(inputs)) is not None:
            text = fields.get("text")
            if isinstance(text, str):
                read += 1
                for phrase in policy.push(text):
                    phrases.put_nowait((phrase, read))
        if (rest := policy.flush()) is not None:
            phrases.put_nowait((rest, read))
    finally:
        phrases.put_nowait(None)
