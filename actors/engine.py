"""The engine protocol: what a stage needs from the model it hosts.

An engine serves many sessions at once. For each session the stage calls
:meth:`Engine.generate` with an async iterator of inputs (chunks arrive while earlier
ones are being processed — that is what lets stages stream into each other) and reads
outputs as they are produced. Kinds: ``scripted`` (declared latencies, deterministic
outputs: the test harness), ``torch`` and ``vllm``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import torch

__all__ = ["Engine", "Fields"]

Fields = Mapping[str, torch.Tensor | str]
"""Named payload fields of a chunk: ``hidden``, ``token_ids``, ``codes``, ``text``, …"""


class Engine(Protocol):
    """One model behind a stage."""

    async def start(self) -> None:
        """Load weights and allocate what every session shares."""

    def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """Outputs for ``session`` as they are produced, while ``inputs`` still arrive."""

    async def abort(self, session: str) -> None:
        """Stop ``session`` now and free its state; its ``generate`` ends promptly."""

    async def stop(self) -> None:
        """Release everything (after every session has ended or been aborted)."""
