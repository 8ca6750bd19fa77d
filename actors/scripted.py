"""``ScriptedEngine``: declared latencies and deterministic outputs, no model.

The test harness's engine: a pipeline of scripted stages behaves like a real one in
timing shape (time to first output, time per output), so streaming, deadlines, aborts
and failures can be tested — and benchmarked against the ideal latency computed from
the declared numbers — without weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch

from omni_actors.actors.engine import CONTEXT_FIELD, Fields
from omni_actors.errors import OmniError

__all__ = ["ScriptedEngine", "ScriptedEngineError"]


class ScriptedEngineError(OmniError):
    """The failure a ``ScriptedEngine`` declared with ``fail_after`` raises."""


def input_rows(fields: Fields) -> int:
    """New rows an input carries: dim 0 of its tensors minus the left context (text: 1)."""
    context_value = fields.get(CONTEXT_FIELD)
    context = int(context_value) if isinstance(context_value, torch.Tensor) else 0
    rows = [
        v.shape[0] if v.dim() else 1
        for k, v in fields.items()
        if isinstance(v, torch.Tensor) and k != CONTEXT_FIELD
    ]
    return max(rows) - context if rows else 1


@dataclass
class ScriptedEngine:
    """Produces output ``k`` of a session as ``token_ids=[k]``, ``hidden`` rows of ``k``,
    ``codes`` rows of ``k % 2048``, ``text="t{k} "`` and ``audio`` (``audio_samples``
    samples of ``k / 1000``), keeping only the fields named in ``fields``.

    Two modes:
        - ``outputs_per_input`` set (a streaming stage such as a talker): every input
          chunk yields that many outputs per new row (dim 0 of its tensors, minus the
          left context a windowed edge adds) as soon as it arrives, so a stage fed one
          whole payload (a ``full`` edge) produces as much as one fed row by row.
        - otherwise (an entry stage such as a thinker): once the input stream ends, it
          yields ``outputs`` outputs.

    The first output of a session comes ``first_output_s`` after the session's first
    input (or, for entry stages, after its last); each further output ``per_output_s``
    after the previous one. With ``fail_after`` set, a session's generate raises
    :class:`ScriptedEngineError` after that many outputs (an engine failure).
    """

    first_output_s: float = 0.0
    per_output_s: float = 0.0
    outputs: int = 8
    outputs_per_input: int | None = None
    fields: tuple[str, ...] = ("token_ids", "hidden", "text")
    hidden_dim: int = 8
    codebooks: int = 4
    audio_samples: int = 1920  # one 12.5 Hz codec frame of 24 kHz audio
    fail_after: int | None = None
    _aborted: dict[str, asyncio.Event] = field(default_factory=dict, init=False, repr=False)
    started: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.fields = tuple(self.fields)
        unknown = set(self.fields) - {"token_ids", "hidden", "codes", "text", "audio"}
        if unknown:
            raise ValueError(f"unknown output fields {sorted(unknown)}")
        if self.first_output_s < 0 or self.per_output_s < 0:
            raise ValueError("latencies must be >= 0")
        if self.outputs < 0 or (self.outputs_per_input is not None and self.outputs_per_input < 1):
            raise ValueError("outputs must be >= 0 and outputs_per_input >= 1")
        if self.fail_after is not None and self.fail_after < 0:
            raise ValueError("fail_after must be >= 0")

    @property
    def active_sessions(self) -> set[str]:
        """Sessions with a running ``generate``."""
        return set(self._aborted)

    async def start(self) -> None:
        """Nothing to load."""
        self.started = True

    async def stop(self) -> None:
        """Abort whatever is still running."""
        for event in self._aborted.values():
            event.set()
        self.started = False

    async def release(self, session: str) -> None:
        """Nothing is kept between segments."""

    async def abort(self, session: str) -> None:
        """End ``session``'s ``generate`` at its next step."""
        event = self._aborted.get(session)
        if event is not None:
            event.set()

    def output(self, k: int) -> dict[str, torch.Tensor | str]:
        """Output number ``k`` of any session (deterministic)."""
        made: dict[str, torch.Tensor | str] = {
            "token_ids": torch.tensor([k]),
            "hidden": torch.full((1, self.hidden_dim), float(k)),
            "codes": torch.full((1, self.codebooks), k % 2048),
            "text": f"t{k} ",
            "audio": torch.full((self.audio_samples,), k / 1000),
        }
        return {name: made[name] for name in self.fields}

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """See the class docstring."""
        if session in self._aborted:
            raise ValueError(f"session {session!r} is already generating")
        aborted = self._aborted[session] = asyncio.Event()
        produced = 0
        try:
            if self.outputs_per_input is None:
                async for _ in inputs:
                    if aborted.is_set():
                        return
                for _ in range(self.outputs):
                    if await self._wait(produced, aborted):
                        return
                    yield self.output(produced)
                    produced += 1
            else:
                async for item in inputs:
                    for _ in range(self.outputs_per_input * input_rows(item)):
                        if await self._wait(produced, aborted):
                            return
                        yield self.output(produced)
                        produced += 1
        finally:
            del self._aborted[session]

    async def _wait(self, produced: int, aborted: asyncio.Event) -> bool:
        """Sleep the declared latency; True if the session was aborted meanwhile."""
        if self.fail_after is not None and produced >= self.fail_after:
            raise ScriptedEngineError(f"scripted failure after {produced} outputs")
        delay = self.first_output_s if produced == 0 else self.per_output_s
        if aborted.is_set():
            return True
        if delay > 0:
            try:
                async with asyncio.timeout(delay):
                    await aborted.wait()
            except TimeoutError:
                return False
            return True
        return False
