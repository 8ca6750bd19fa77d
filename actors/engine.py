"""The engine protocol: what a stage needs from the model it hosts.

An engine serves many sessions at once. For each session the stage calls
:meth:`Engine.generate` with an async iterator of inputs (chunks arrive while earlier
ones are being processed — that is what lets stages stream into each other) and reads
outputs as they are produced. One call serves one *segment*: a resumable session calls
``generate`` again for its next segment, and the engine may keep conversation state
per session between calls until :meth:`Engine.release` (or ``abort``). The stage names
a session by its :data:`~omni_actors.protocols.stage.SessionKey`, unique for the
pipeline's life, so per-session state never outlives its admission. Kinds:
``scripted`` (declared latencies, deterministic outputs: the test harness), ``torch``
and ``vllm``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import torch

from omni_actors.protocols.stage import SessionKey

__all__ = ["CONTEXT_FIELD", "Engine", "Fields"]

Fields = Mapping[str, torch.Tensor | str]
"""Named payload fields of a chunk: ``hidden``, ``token_ids``, ``codes``, ``text``, …"""

CONTEXT_FIELD = "left_context"
"""Added to an input from an edge that windows codec frames (``ChunkPolicy``): a 0-d
int64 tensor, how many leading rows of the windowed field are left context, decoded
only to continue the waveform seamlessly, not to be emitted again."""


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
