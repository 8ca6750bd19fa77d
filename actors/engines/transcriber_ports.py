"""The transcriber stage's port contract: what a transcriber takes and yields.

A pipeline's transcriber (``outputs.transcript``) takes the caller's input beside the
entry stage (a fan-out: it is off the reply's path) and its outputs reach the caller as
transcript events, one per user turn. The session forwards it the caller's audio while
transcription is on (``Session.transcribe``), each turn's ``item`` before the turn's
``commit``, and every segment's end; any engine that declares these ports serves the
stage (``transformers.asr``, a scripted one in tests). The entry stage may be the
transcriber too (a cascade's recognizer, ``cascade.asr``): it hears every turn for the
stages after it, and is told the ``item`` of each turn committed while transcription
is on; those are the turns it tells the caller of.

Inputs, any of them per chunk:

- ``audio``: float32 1-D mono at the pipeline's ``inputs.sample_rate``, appended to
  the open turn.
- ``turn``: a turn mark: ``commit`` ends the open turn (it is transcribed), ``clear``
  drops it. A segment's end ends it too.
- ``item``: str, the caller's name for the open turn (echoed in its transcript).
- ``language``, ``prompt``: str, settings for the turns from now on ("" for none).

Outputs, per turn with audio, in order:

- any number of ``item`` and ``transcript_delta``: the next piece of the turn's text,
  as the model writes it (a transcriber that does not stream yields none);
- then ``item`` and ``transcript`` (the turn's whole text), or ``item`` and
  ``transcript_error`` (why that turn could not be transcribed: the other turns go on).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from omni_actors.actors.engines.contract import TURN_FIELD, Rule

__all__ = [
    "ITEM_FIELD",
    "LANGUAGE_FIELD",
    "PROMPT_FIELD",
    "TRANSCRIBER_INPUTS",
    "TRANSCRIBER_OUTPUTS",
    "TRANSCRIPT_DELTA_FIELD",
    "TRANSCRIPT_ERROR_FIELD",
    "TRANSCRIPT_FIELD",
]

TRANSCRIPT_FIELD = "transcript"
"""A turn's transcript (str)."""

TRANSCRIPT_DELTA_FIELD = "transcript_delta"
"""The next piece of a turn's transcript, as the model writes it (str)."""

TRANSCRIPT_ERROR_FIELD = "transcript_error"
"""Why a turn's transcript failed (str)."""

ITEM_FIELD = "item"
"""The caller's name for a user turn (str): in the input before its ``commit``, in the
output with its transcript."""

LANGUAGE_FIELD = "language"
"""The language spoken (an ISO-639-1 code such as ``en``; "" to detect it)."""

PROMPT_FIELD = "prompt"
"""Text that guides the transcription (vocabulary, style; "" for none)."""

TRANSCRIBER_INPUTS: Final[Mapping[str, Rule]] = MappingProxyType(
    {
        "audio": "concat",
        TURN_FIELD: "concat",
        ITEM_FIELD: "replace",
        LANGUAGE_FIELD: "replace",
        PROMPT_FIELD: "replace",
    }
)
"""What a transcriber takes (module docstring), with each field's accumulate rule."""

TRANSCRIBER_OUTPUTS: Final[Mapping[str, Rule]] = MappingProxyType(
    {
        TRANSCRIPT_FIELD: "concat",
        TRANSCRIPT_DELTA_FIELD: "concat",
        TRANSCRIPT_ERROR_FIELD: "concat",
        ITEM_FIELD: "replace",
    }
)
"""What a transcriber yields (module docstring), with each field's accumulate rule."""
