"""``RecognizerEngine`` (kind ``cascade.asr``): the cascade's entry, speech to the LLM's text.

The caller's input comes here first. Audio is gathered per user turn and transcribed
once the turn is committed (a ``commit`` mark, or the end of the input), by the
``transformers.asr`` engine's model code (:class:`~omni_actors.actors.engines.asr.engine.AsrEngine`:
Whisper, or any transformers speech-to-text checkpoint); its transcript goes on to the
LLM as the turn's ``text``, then the mark. Everything else the LLM takes passes through
in order: text the caller typed, instructions, and the turn marks (``clear`` also drops
the open turn's audio here; ``truncate`` and ``reply`` are the LLM's). So the LLM starts
on the transcript the moment it exists, and a text-only request never waits for the
recognizer's model.

It declares the transcriber's ports too, so a pipeline names it its transcriber
(``outputs.transcript``): a turn whose ``item`` it was told (the session tells it while
the caller asks for transcripts) is told to the caller as a transcriber tells it
(``transcript_delta`` pieces as they are decoded, then ``transcript``, or
``transcript_error``), in fields the LLM does not take; the LLM gets the turn's whole
text alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar, Final

from omni_actors.actors.engines.asr.engine import AsrArgs, AsrEngine, _OpenTurn, _Settings, _Turn
from omni_actors.actors.engines.cascade.family import stage_checkpoint
from omni_actors.actors.engines.cascade.llm_engine import LLM_INPUTS
from omni_actors.actors.engines.contract import TURN_FIELD, Fields, Rule
from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.actors.engines.transcriber_ports import (
    TRANSCRIBER_INPUTS,
    TRANSCRIBER_OUTPUTS,
    TRANSCRIPT_ERROR_FIELD,
    TRANSCRIPT_FIELD,
)
from omni_actors.errors import EngineError
from omni_actors.protocols.stage import SessionKey

__all__ = ["RecognizerEngine", "TranscriptionError"]

_PASSED: Final = tuple(name for name in LLM_INPUTS if name != "text")
"""Input fields passed on to the LLM as they come (marks, their values, instructions)."""


class TranscriptionError(EngineError):
    """A user turn's audio could not be transcribed (the message says why)."""


class RecognizerEngine(AsrEngine):
    """Transcripts of the caller's audio turns, in line with the rest of its input."""

    kind = "cascade.asr"
    Args = AsrArgs
    inputs: ClassVar[dict[str, Rule]] = {**TRANSCRIBER_INPUTS, **LLM_INPUTS}
    outputs: ClassVar[dict[str, Rule]] = {**LLM_INPUTS, **TRANSCRIBER_OUTPUTS}
    streams_input = True

    def __init__(self, args: AsrArgs) -> None:
        super().__init__(args, stage_checkpoint(args, "asr"))

    async def generate(
        self, session: SessionKey, inputs: AsyncIterator[Fields]
    ) -> AsyncIterator[Fields]:
        """The input, its audio turns replaced by their transcripts (module docstring)."""
        abort = self._aborts.setdefault(session, AbortSignal())
        settings = self._settings.setdefault(session, _Settings())
        turn = _OpenTurn()
        while (fields := await abort.next_input(inputs)) is not None:
            turn.take(fields, settings)
            mark = fields.get(TURN_FIELD)
            text = fields.get("text")
            if isinstance(text, str) and text and mark != "reply":
                yield {"text": text}  # the user's: a reply mark's text is the assistant's
            if mark in ("commit", "reply"):  # a reply mark commits the open turn first
                async for out in self._said(turn.close(settings), abort):
                    yield out
            elif mark == "clear":
                turn.drop()
            passed = {name: fields[name] for name in _PASSED if name in fields}
            if mark == "reply" and "text" in fields:
                passed["text"] = fields["text"]
            if passed:
                yield passed
            if abort.aborted:
                return
        async for out in self._said(turn.close(settings), abort):
            yield out

    async def _said(self, turn: _Turn | None, abort: AbortSignal) -> AsyncIterator[Fields]:
        """The transcript of the committed ``turn`` as the LLM's text, and, for a turn
        with an item, as the caller's (nothing without one, or once aborted)."""
        if turn is None:
            return
        async for out in self._turn(turn, abort):
            if turn.item:  # the caller's: its pieces, its whole, its error
                yield out
            error = out.get(TRANSCRIPT_ERROR_FIELD)
            if isinstance(error, str):
                raise TranscriptionError(f"the user's audio could not be transcribed: {error}")
            text = out.get(TRANSCRIPT_FIELD)
            if isinstance(text, str) and text:
                yield {"text": text}  # the LLM's: the whole turn, never a piece of it
