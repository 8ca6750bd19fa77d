"""Fault injection on a pipeline's edges and stages, for actor-level tests.

``PipelineFaults`` turns declared faults into the hooks ``OmniPipeline`` takes: an
interposer actor on an edge that drops, duplicates, reorders or delays chunks by
sequence number, and stage actors that crash after a number of messages. The chunks
are real messages through real mailboxes; only their order and count change.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from omni_actors._actor import Actor
from omni_actors._ref import ActorRef
from omni_actors.actors.stage.actor import StageActor
from omni_actors.actors.stage.steps import unpack
from omni_actors.protocols.stage import Chunk, SessionKey, StepChunks
from omni_actors.testing.faults import crash_after

__all__ = ["ChunkFaults", "FaultyEdge", "PipelineFaults"]


@dataclass(frozen=True, slots=True)
class ChunkFaults:
    """What happens to the chunks of every session on one edge, by sequence number.

    Attributes:
        drop: never delivered (the receiver sees a gap).
        duplicate: delivered twice (the receiver must drop the copy).
        swap: held back and delivered after the next chunk (out of order).
        delay_s: every chunk is delivered this much later (in order).
        drop_every: every ``n``-th chunk through the edge, whatever its session, is
            never delivered (0: none); a fault that strikes now and then.
        duplicate_every: every ``n``-th chunk through the edge is delivered twice.
    """

    drop: frozenset[int] = frozenset()
    duplicate: frozenset[int] = frozenset()
    swap: frozenset[int] = frozenset()
    delay_s: float = 0.0
    drop_every: int = 0
    duplicate_every: int = 0


class FaultyEdge(Actor[Chunk | StepChunks]):
    """Sits between two stages and applies :class:`ChunkFaults` to what passes (the
    chunks of a step one by one, each forwarded alone)."""

    def __init__(self, target: ActorRef[Chunk], faults: ChunkFaults) -> None:
        self.target = target
        self.faults = faults
        self.held: dict[SessionKey, Chunk] = {}
        self.passed = 0  # chunks through this edge, for the ``*_every`` faults
        self.dropped = 0
        self.duplicated = 0

    async def receive(self, message: Chunk | StepChunks) -> None:
        """Forward ``message`` with the declared faults."""
        if isinstance(message, StepChunks):
            for chunk in unpack(message):
                await self._forward(chunk)
        else:
            await self._forward(message)

    async def _forward(self, message: Chunk) -> None:
        faults = self.faults
        if faults.delay_s:
            await asyncio.sleep(faults.delay_s)
        self.passed += 1
        if message.seq in faults.drop or _every(faults.drop_every, self.passed):
            self.dropped += 1
            return
        if message.seq in faults.swap and not message.end:
            self.held[message.key] = message
            return
        await self.target.tell(message)
        if message.seq in faults.duplicate or _every(faults.duplicate_every, self.passed):
            self.duplicated += 1
            await self.target.tell(message)
        held = self.held.pop(message.key, None)
        if held is not None:
            await self.target.tell(held)


def _every(n: int, count: int) -> bool:
    return n > 0 and count % n == 0


@dataclass(frozen=True, slots=True)
class PipelineFaults:
    """Faults to build a pipeline with: ``OmniPipeline(spec, **faults.hooks())``.

    Attributes:
        edges: per edge ``"from->to"`` (``"input-><entry stage>"`` for the caller's
            input), the chunk faults.
        crash_after: per stage, crash its actor on message ``n + 1`` (once); the
            supervisor restarts it. Local stages only.
    """

    edges: dict[str, ChunkFaults] = field(default_factory=dict)
    crash_after: dict[str, int] = field(default_factory=dict)

    def hooks(self) -> dict[str, Any]:
        """Keyword arguments for ``OmniPipeline``."""
        return {
            "stage_classes": {
                stage: crash_after(StageActor, n) for stage, n in self.crash_after.items()
            },
            "interposers": {edge: (FaultyEdge, (faults,)) for edge, faults in self.edges.items()},
        }
