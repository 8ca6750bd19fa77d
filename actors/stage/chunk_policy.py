"""``ChunkPolicy``: the one implementation of codec-frame windowing for every model.

A talker produces codec frames one step at a time; code2wav decodes them in chunks. The
first chunk is small (``initial_frames``) so the first audio packet leaves early; the
next ones may grow (``ramp``) before later chunks hold ``frames`` new frames. A ramp keeps
the listener's player fed: the second packet has to arrive before the first has played
out, and a second chunk of ``frames`` frames takes its talker ``frames`` steps, far longer
than ``initial_frames`` frames of audio last unless the talker is many times faster than
real time; chunks that grow (4, 8, 16, then 25) each take about as long to make as the
audio before them lasts. Each chunk also carries up to ``left_context`` frames
that precede its new ones, because a causal decoder needs them to continue the waveform
seamlessly — those context frames are *not* new and must not be decoded into audio
twice.

Guarantees (property-tested): over any arrival pattern, the new frames of the emitted
chunks, concatenated, are exactly the input, each frame once; ``finish`` flushes only
what is pending (nothing when the input ended exactly on a chunk boundary); every chunk
carries exactly the context frames that precede it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Cat = Callable[[list[torch.Tensor]], torch.Tensor]
"""Joins tensors along dim 0."""

__all__ = ["Cat", "ChunkPolicy", "FrameChunk", "FrameWindow"]


@dataclass(frozen=True, slots=True)
class ChunkPolicy:
    """Chunk sizes for one edge that carries codec frames.

    Defaults are the values vllm-omni uses for Qwen3-Omni's talker → code2wav edge.

    Attributes:
        initial_frames: new frames of the first chunk.
        frames: new frames of every chunk after the ramp.
        left_context: frames before a chunk's new ones that it carries as context.
        ramp: new frames of the chunks between the first and the steady ones, in order
            (empty: the second chunk already holds ``frames``).
    """

    initial_frames: int = 4
    frames: int = 25
    left_context: int = 25
    ramp: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.initial_frames < 1 or self.frames < 1 or any(n < 1 for n in self.ramp):
            raise ValueError(
                f"chunk sizes must be >= 1, got initial_frames={self.initial_frames}, "
                f"frames={self.frames}, ramp={list(self.ramp)}"
            )
        if self.left_context < 0:
            raise ValueError(f"left_context must be >= 0, got {self.left_context}")

    def size(self, chunk: int) -> int:
        """New frames of chunk number ``chunk`` (from 0) of a stream, unless it is the
        stream's last (which holds what is left)."""
        if chunk == 0:
            return self.initial_frames
        if chunk <= len(self.ramp):
            return self.ramp[chunk - 1]
        return self.frames

    def window(self, cat: Cat = torch.cat) -> FrameWindow:
        """A fresh window for one session's frame stream (``cat``: see :class:`FrameWindow`)."""
        return FrameWindow(self, cat)


@dataclass(frozen=True, slots=True)
class FrameChunk:
    """Frames to decode: ``context`` leading frames already emitted, then new ones.

    Attributes:
        frames: ``[context + new, ...]`` along dim 0.
        context: how many leading frames are context only.
        start: stream index of the first new frame.
        final: the stream ended with this chunk.
    """

    frames: torch.Tensor
    context: int
    start: int
    final: bool

    @property
    def new(self) -> torch.Tensor:
        """The frames this chunk contributes for the first time."""
        return self.frames[self.context :]


class FrameWindow:
    """Turns a stream of frame batches into chunks, following a :class:`ChunkPolicy`.

    Keeps only the frames it may still need (pending ones plus the left context), so a
    long session does not grow memory. ``cat`` joins the frames pushed since the last
    chunk (a GPU stage's ``StageTransfers.concat``: joined once the steps that made them
    are done and marked so, where ``torch.cat`` on the event loop would queue behind the
    next step and leave the chunk's copy waiting for it too).
    """

    def __init__(self, policy: ChunkPolicy, cat: Cat = torch.cat) -> None:
        self.policy = policy
        self.cat = cat
        self._kept: torch.Tensor | None = None
        self._parts: list[torch.Tensor] = []  # pushed after _kept, joined only to emit
        self._received = 0
        self._kept_start = 0  # stream index of self._kept[0]
        self._emitted = 0  # frames emitted as new so far
        self._chunks = 0  # chunks emitted so far
        self._finished = False

    @property
    def emitted(self) -> int:
        """Frames emitted as new so far."""
        return self._emitted

    @property
    def pending(self) -> int:
        """Frames received but not yet emitted."""
        return self._received - self._emitted

    def push(self, frames: torch.Tensor) -> list[FrameChunk]:
        """Add frames (time on dim 0); return the chunks that are now complete."""
        if self._finished:
            raise RuntimeError("push() after finish(): the frame stream has ended")
        if frames.dim() == 0:
            raise ValueError("frames need a time dimension (dim 0)")
        # Frames usually arrive one at a time: join them once per chunk, not per push.
        self._parts.append(frames)
        self._received += frames.shape[0]
        chunks: list[FrameChunk] = []
        while True:
            size = self.policy.size(self._chunks)
            if self.pending < size:
                return chunks
            chunks.append(self._emit(size, final=False))

    def finish(self) -> list[FrameChunk]:
        """End the stream: the pending tail as one final chunk (none if nothing is left)."""
        if self._finished:
            return []
        self._finished = True
        pending = self.pending
        return [self._emit(pending, final=True)] if pending else []

    def _emit(self, size: int, *, final: bool) -> FrameChunk:
        if self._parts:
            parts = self._parts if self._kept is None else [self._kept, *self._parts]
            self._kept = parts[0] if len(parts) == 1 else self.cat(parts)
            self._parts = []
        kept = self._kept
        assert kept is not None
        start = self._emitted
        context_start = max(0, start - self.policy.left_context)
        offset = self._kept_start
        chunk = FrameChunk(
            frames=kept[context_start - offset : start + size - offset],
            context=start - context_start,
            start=start,
            final=final,
        )
        self._emitted += size
        self._chunks += 1
        # Forget frames no future chunk can need as context.
        drop = max(0, self._emitted - self.policy.left_context) - offset
        if drop > 0:
            self._kept = kept[drop:]
            self._kept_start += drop
        return chunk
