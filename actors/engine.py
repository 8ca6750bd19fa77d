"""The engine protocol: what a stage needs from the model it hosts, and what it declares.

An engine serves many sessions at once. For each session the stage calls
:meth:`Engine.generate` with an async iterator of inputs (chunks arrive while earlier
ones are being processed — that is what lets stages stream into each other) and reads
outputs as they are produced. One call serves one *segment*: a resumable session calls
``generate`` again for its next segment, and the engine may keep conversation state
per session between calls until :meth:`Engine.release` (or ``abort``). The stage names
a session by its :data:`~omni_actors.protocols.stage.SessionKey`, unique for the
pipeline's life, so per-session state never outlives its admission.

An engine class declares itself with class attributes, so a pipeline can be checked
before anything starts and no table elsewhere has to know about it::

    class EchoArgs(BaseModel):
        delay_s: float = 0.0


    class EchoEngine:
        kind = "echo"  # its registry name (entry point ``omni_actors.engines``)
        Args = EchoArgs  # a pydantic model of ``engine.args``; the engine gets an instance
        inputs = {"text": "concat"}  # fields it takes, with their accumulate rule
        outputs = {"text": "concat"}  # fields it yields, with their accumulate rule
        streams_input = True  # it can start on a segment's first chunk

        def __init__(self, args: EchoArgs) -> None: ...

An engine whose fields depend on its arguments defines ``ports`` instead of ``inputs``,
``outputs`` and ``streams_input``: a classmethod that takes the validated ``Args`` and
returns :class:`Ports`. ``Args`` may be left out (the engine then takes no arguments),
and so may ``streams_input`` (True). ``kind`` names a registered engine; a class named
by its import path (``package.module:Class`` in a pipeline) needs none.

The accumulate rule of a field says how a sequence of outputs makes one payload:
``concat`` joins tensors along dim 0 (and strings end to end), ``replace`` keeps the
last. A ``full`` edge merges a segment's outputs by it, and an edge is valid only when
both ends name the same rule for each field it carries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol, get_args

import torch

from omni_actors.protocols.control import AccumulateRule
from omni_actors.protocols.stage import SessionKey

__all__ = ["CONTEXT_FIELD", "RULES", "Engine", "Fields", "Ports", "Rule"]

Fields = Mapping[str, torch.Tensor | str]
"""Named payload fields of a chunk: ``hidden``, ``token_ids``, ``codes``, ``text``, …"""

Rule = AccumulateRule
"""How a field's successive values make one payload (see the module docstring)."""

RULES: tuple[Rule, ...] = get_args(AccumulateRule)

CONTEXT_FIELD = "left_context"
"""Added to an input from an edge that windows codec frames (``ChunkPolicy``): a 0-d
int64 tensor, how many leading rows of the windowed field are left context, decoded
only to continue the waveform seamlessly, not to be emitted again. It is not a declared
field: the edge adds it, whatever the engines declare."""


@dataclass(frozen=True, slots=True)
class Ports:
    """What an engine takes and yields, read by the pipeline to check and wire its edges.

    Attributes:
        inputs: the fields it takes, each with its accumulate rule.
        outputs: the fields it yields, each with its accumulate rule.
        streams_input: it can work on a segment's chunks as they arrive; an engine that
            needs the whole payload first takes only ``full`` edges.
    """

    inputs: Mapping[str, Rule]
    outputs: Mapping[str, Rule]
    streams_input: bool = True


class Engine(Protocol):
    """One model behind a stage."""

    async def start(self) -> None:
        """Load weights and allocate what every session shares."""

    def generate(self, session: SessionKey, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """Outputs for ``session`` as they are produced, while ``inputs`` still arrive."""

    async def abort(self, session: SessionKey) -> None:
        """Stop ``session`` now and free its state; its ``generate`` ends promptly."""

    async def release(self, session: SessionKey) -> None:
        """``session`` ended normally: drop whatever state it kept between segments."""

    async def stop(self) -> None:
        """Release everything (after every session has ended or been aborted)."""
