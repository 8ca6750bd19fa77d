"""``Code2WavEngine``: tiny-omni's code2wav as a streaming torch engine that batches sessions.

Input: windows of codec frames as the talker -> code2wav edge cuts them (``ChunkPolicy``):
``codes`` [context + new, num_quantizers] integers and ``left_context`` (0-d, absent when
0). Output: ``audio``, float32 1-D at 24 kHz, exactly the samples each chunk adds.

Audio length. code2wav's transposed convolutions trim their last step, so HF's forward
turns ``n`` frames into ``1920 * n - 555`` samples: a window's last 555 samples need the
frame after it. The engine loads the model with that trim off (:func:`keep_pending_tail`),
so a forward returns ``1920 * n`` samples: HF's, then 555 decoded as if nothing followed.
Per segment (one ``generate`` call) it yields:

- per chunk with ``left_context`` c > 0: from sample ``1920 * c - 555`` of the window on,
  i.e. the previous chunk's 555 held-back samples (now exact) and ``1920 * new - 555``
  new ones: ``1920 * new`` samples;
- per chunk with no context: the previous chunk's held-back samples if any (only a policy
  without left context has such chunks after the first), then ``1920 * new - 555``;
- once the input ends: the last chunk's 555 held-back samples, as the utterance's end.

So a segment of ``F`` frames is exactly ``1920 * F`` samples (80 ms per frame) in
``chunks + 1`` outputs, however it is chunked: a ``full`` edge (one chunk) and a streamed
one have the same length, and the same samples when each chunk's context covers the
receptive field (20 frames for tiny-omni; ``ChunkPolicy``'s 25 do) or every earlier frame.
The first ``1920 * F - 555`` samples are HF's one-shot decode of the whole sequence.

Batching. Sessions queue requests and await their futures; one batcher task, owned by the
engine, takes the oldest live request plus every live one of the same window length (up
to ``max_batch``) and decodes them in one forward in the model thread. Equal lengths
only: code2wav has no mask, and right-padding, though harmless to the emitted samples of
a causal model, would change the held-back tail. Steady-state windows (25 + 25 frames)
share one length, so sessions speaking at once share forwards; requests arriving during
a forward join the next. ``batch_wait_ms`` holds an idle batcher before its first forward
to gather sessions that start together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
)

from omni_actors.actors.engine import CONTEXT_FIELD, Fields
from omni_actors.actors.tiny_omni import weights
from omni_actors.actors.torch_engine import TorchEngine, stage_dir
from omni_actors.errors import EngineError

__all__ = [
    "Code2WavEngine",
    "Code2WavInputError",
    "Code2WavStats",
    "EngineStoppedError",
    "keep_pending_tail",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
_Piece = tuple[torch.Tensor, torch.Tensor]  # (audio to emit now, samples held back)

_ARGS: Final = frozenset({"model", "seed", "cache_dir", "stage", "max_batch", "batch_wait_ms"})
_INTEGER: Final = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


class Code2WavInputError(EngineError, ValueError):
    """An input chunk is not a window of codec frames this decoder can take."""


class EngineStoppedError(EngineError):
    """The engine is not started, or stopped while the session was still generating."""


@dataclass
class Code2WavStats:
    """What the batcher did, so tests and benchmarks can prove and price batching."""

    forwards: int = 0
    rows: int = 0
    """Chunks decoded (summed batch sizes): ``rows / forwards`` is the mean batch."""
    largest: int = 0
    forwards_by_rows: dict[int, int] = field(default_factory=dict)
    seconds_by_rows: dict[int, float] = field(default_factory=dict)
    """Batch size -> summed seconds of its forwards, timed in the model thread."""

    def record(self, rows: int, seconds: float) -> None:
        """Count one forward of ``rows`` chunks that took ``seconds``."""
        self.forwards += 1
        self.rows += rows
        self.largest = max(self.largest, rows)
        self.forwards_by_rows[rows] = self.forwards_by_rows.get(rows, 0) + 1
        self.seconds_by_rows[rows] = self.seconds_by_rows.get(rows, 0.0) + seconds

    def mean_forward_s(self, rows: int) -> float:
        """Mean seconds of a forward of ``rows`` chunks (0.0 if none ran)."""
        count = self.forwards_by_rows.get(rows, 0)
        return self.seconds_by_rows.get(rows, 0.0) / count if count else 0.0


@dataclass(eq=False, slots=True)
class _Request:
    """One chunk for the batcher: ``codes`` [Q, T] int64, the first sample to emit, and a
    future for ``(audio to emit, held-back tail)``, cancelled if the session ends first."""

    codes: torch.Tensor
    start: int
    future: asyncio.Future[_Piece]


@dataclass(eq=False, slots=True)
class _Session:
    """A running ``generate``; ``ended`` gets the reason (aborted, stopped) to end it."""

    ended: asyncio.Future[str]
    request: _Request | None = None

    def end(self, reason: str) -> None:
        if not self.ended.done():
            self.ended.set_result(reason)
        if self.request is not None:
            self.request.future.cancel()  # the batcher skips it; a running forward's row is dropped


def keep_pending_tail(model: Qwen3OmniMoeCode2Wav) -> int:
    """Make ``model`` return ``1920 * n`` samples for ``n`` frames instead of ``1920 * n - 555``.

    Each upsampling transposed convolution trims ``kernel - stride`` steps at both ends;
    the right trim drops the steps still missing the next input's overlap-add. Keeping
    them changes no earlier sample (later layers are causal, and a transposed convolution
    reads one step ahead at most). Checked on a probe, so a change in transformers fails
    loading instead of corrupting audio.

    Returns:
        The number of pending samples per window (555 for tiny-omni and Qwen3-Omni).

    Raises:
        RuntimeError: the model does not behave as described.
    """
    per_frame = int(model.total_upsample)
    probe = torch.arange(2 * model.config.num_quantizers).remainder(model.config.codebook_size)
    probe = probe.view(1, model.config.num_quantizers, 2)
    with torch.no_grad():
        trimmed = model(probe)[:, 0]
        for module in model.modules():
            if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                module.right_pad = 0
        kept = model(probe)[:, 0]
    pending = int(kept.shape[-1]) - int(trimmed.shape[-1])
    same = torch.allclose(kept[:, : trimmed.shape[-1]], trimmed, atol=1e-6, rtol=0.0)
    if kept.shape[-1] != 2 * per_frame or not 0 < pending < per_frame or not same:
        raise RuntimeError(
            f"code2wav with its tail kept gave {kept.shape[-1]} samples for 2 frames "
            f"(expected {2 * per_frame}, prefix unchanged: {same}); "
            "transformers' Qwen3OmniMoeCausalTransConvNet changed"
        )
    return pending


class Code2WavEngine(TorchEngine):
    """Streams codec-frame windows to 24 kHz audio; see the module docstring.

    Args:
        args: ``model`` (tiny-omni), ``seed`` (0), ``cache_dir`` locate the weights;
            ``stage`` (code2wav) is for the engine factory; ``max_batch`` (16) caps chunks
            per forward; ``batch_wait_ms`` (0): an idle batcher's wait for more sessions.

    Raises:
        ValueError: unknown or invalid args.
        ModelNotPreparedError: the weights are not prepared.
    """

    def __init__(self, args: dict[str, Any]) -> None:
        unknown = sorted(set(args) - _ARGS)
        if unknown:
            raise ValueError(f"unknown code2wav engine args {unknown}; known: {sorted(_ARGS)}")
        if args.get("stage", "code2wav") != "code2wav":
            raise ValueError(f"Code2WavEngine serves stage code2wav, not {args['stage']!r}")
        self.max_batch = int(args.get("max_batch", 16))
        self.batch_wait_s = float(args.get("batch_wait_ms", 0)) / 1e3
        if self.max_batch < 1 or self.batch_wait_s < 0:
            raise ValueError(f"need max_batch >= 1 and batch_wait_ms >= 0, got {args}")
        super().__init__(stage_dir(args, "code2wav"), "code2wav")
        self.stats = Code2WavStats()
        self._model: Qwen3OmniMoeCode2Wav | None = None
        self._quantizers = 0
        self._codebook = 0
        self._per_frame = 0
        self._pending = 0
        self._sessions: dict[str, _Session] = {}
        self._queue: deque[_Request] = deque()
        self._wake = asyncio.Event()
        self._batcher: asyncio.Task[None] | None = None

    @property
    def active_sessions(self) -> set[str]:
        """Sessions with a running ``generate`` (an aborted one leaves at once)."""
        return set(self._sessions)

    @property
    def pending_samples(self) -> int:
        """Samples each chunk holds back until the next chunk or the segment's end (555)."""
        return self._pending

    async def start(self) -> None:
        """Load the decoder in the model thread, then start the batcher."""
        await super().start()
        if self._batcher is None:
            self._batcher = asyncio.get_running_loop().create_task(
                self._batch_loop(), name="code2wav batcher"
            )

    def _load(self, path: Path) -> None:
        model = weights.load(path)
        if not isinstance(model, Qwen3OmniMoeCode2Wav):
            raise TypeError(f"{path} holds a {type(model).__name__}, not a code2wav stage")
        self._pending = keep_pending_tail(model)
        self._quantizers = int(model.config.num_quantizers)
        self._codebook = int(model.config.codebook_size)
        self._per_frame = int(model.total_upsample)
        self._model = model

    async def stop(self) -> None:
        """End the batcher, fail sessions still generating, then end the model thread."""
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.cancel()
            await asyncio.wait((batcher,))
            if not batcher.cancelled() and batcher.exception() is not None:
                log.error("code2wav batcher had failed", exc_info=batcher.exception())
        for session in self._sessions.values():
            session.end("stopped")
        self._sessions.clear()
        self._queue.clear()
        await super().stop()

    async def abort(self, session: str) -> None:
        """End ``session``'s ``generate`` now; its queued chunk is never decoded."""
        state = self._sessions.pop(session, None)
        if state is not None:
            state.end("aborted")

    async def release(self, session: str) -> None:
        """Nothing to drop: each segment is an utterance of its own, no state is kept."""

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """``{"audio": ...}`` per input chunk, then the held-back tail; see the module docstring.

        Raises:
            Code2WavInputError: a chunk is not ``[frames, num_quantizers]`` codes in range.
            EngineStoppedError: the engine is not running, or stopped meanwhile.
            ValueError: ``session`` is already generating.
        """
        if self._batcher is None:
            raise EngineStoppedError("code2wav engine is not started")
        if session in self._sessions:
            raise ValueError(f"session {session!r} is already generating")
        loop = asyncio.get_running_loop()
        state = self._sessions[session] = _Session(loop.create_future())
        tail: torch.Tensor | None = None
        try:
            while (fields := await self._until_ended(state, _read(inputs))) is not None:
                window = self._window(fields)
                if window is None:
                    continue
                request = _Request(*window, loop.create_future())
                state.request = request
                self._queue.append(request)
                self._wake.set()
                decoded = await self._until_ended(state, request.future)
                state.request = None
                if decoded is None:
                    return
                if request.start == 0 and tail is not None:  # a chunk without context
                    decoded = (torch.cat((tail, decoded[0])), decoded[1])
                audio, tail = decoded
                yield {"audio": audio}
            if tail is not None and not state.ended.done():
                yield {"audio": tail}
        finally:
            state.end("finished")
            if self._sessions.get(session) is state:
                del self._sessions[session]

    async def _until_ended(self, state: _Session, awaitable: Awaitable[T]) -> T | None:
        """``awaitable``'s result, or None at once if the session is aborted meanwhile
        (it may wait for input that never comes, or behind other sessions' forwards).

        Raises:
            EngineStoppedError: the engine stopped meanwhile.
        """
        waited = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait((waited, state.ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waited.done():
                waited.cancel()
                await asyncio.wait((waited,))
        if not state.ended.done():
            return waited.result()
        if not waited.cancelled():
            waited.exception()  # whatever came with the abort is dropped, not logged
        if state.ended.result() == "stopped":
            raise EngineStoppedError("code2wav engine stopped while the session was generating")
        return None

    def _window(self, fields: Fields) -> tuple[torch.Tensor, int] | None:
        """``(codes [Q, T] int64, first sample to emit)``, None if the input adds nothing.

        Checked here so a bad chunk fails its own session, not a batch of sessions.
        """
        codes = fields.get("codes")
        if not isinstance(codes, torch.Tensor):
            raise Code2WavInputError(f"code2wav needs a 'codes' tensor, got {type(codes).__name__}")
        if codes.dim() != 2 or codes.shape[1] != self._quantizers or codes.dtype not in _INTEGER:
            raise Code2WavInputError(
                f"code2wav needs integer codes [frames, {self._quantizers}], "
                f"got {codes.dtype} {tuple(codes.shape)}"
            )
        raw = fields.get(CONTEXT_FIELD)
        context = int(raw) if isinstance(raw, torch.Tensor) else 0
        if not 0 <= context <= codes.shape[0]:
            raise Code2WavInputError(f"left_context {context} outside [0, {codes.shape[0]}]")
        if context == codes.shape[0]:
            return None
        if int(codes.min()) < 0 or int(codes.max()) >= self._codebook:
            raise Code2WavInputError(f"codes must lie in [0, {self._codebook})")
        start = context * self._per_frame - self._pending if context else 0
        return codes.to(torch.long).T.contiguous(), start

    async def _batch_loop(self) -> None:
        """Decode whatever is pending, one same-length group per forward, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Sessions woken by the same event (or forward) submit within a few loop turns.
            await asyncio.sleep(self.batch_wait_s)
            while group := self._take_group():
                await self._run_group(group)

    def _take_group(self) -> list[_Request]:
        """The oldest live request and up to ``max_batch - 1`` live ones of its length."""
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()
        if not self._queue:
            return []
        length = self._queue[0].codes.shape[-1]
        group: list[_Request] = []
        rest: deque[_Request] = deque()
        for request in self._queue:
            if request.future.done():
                continue
            if len(group) < self.max_batch and request.codes.shape[-1] == length:
                group.append(request)
            else:
                rest.append(request)
        self._queue = rest
        return group

    async def _run_group(self, group: list[_Request]) -> None:
        codes = torch.stack([r.codes for r in group])
        try:
            pieces, seconds = await self.call(self._decode, codes, [r.start for r in group])
        except Exception as exc:  # a failed forward fails its rows' sessions, not the batcher
            for request in group:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        self.stats.record(len(group), seconds)
        for request, piece in zip(group, pieces, strict=True):
            if not request.future.done():
                request.future.set_result(piece)

    def _decode(self, codes: torch.Tensor, starts: list[int]) -> tuple[list[_Piece], float]:
        """Model thread: decode ``codes`` [B, Q, T]; per row (audio to emit, pending tail)."""
        assert self._model is not None
        began = time.perf_counter()
        with torch.no_grad():
            wav = self._model(codes)[:, 0]
        seconds = time.perf_counter() - began
        cut = wav.shape[-1] - self._pending
        # Copies, so an output does not keep the whole batch's waveform alive.
        pieces = [(wav[i, s:cut].clone(), wav[i, cut:].clone()) for i, s in enumerate(starts)]
        return pieces, seconds


async def _read(inputs: AsyncIterator[Fields]) -> Fields | None:
    try:
        return await anext(inputs)
    except StopAsyncIteration:
        return None
