"""``Code2WavEngine``: tiny-omni's code2wav as a streaming torch engine that batches sessions.

Input: windows of codec frames as the talker -> code2wav edge cuts them (``ChunkPolicy``):
``codes`` [context + new, num_quantizers] integers and ``left_context`` (0-d, absent when
0). Output: ``audio``, float32 1-D at 24 kHz, exactly the samples each chunk adds.

Audio length. The decoder keeps the 555 samples HF trims from each window's end
(:mod:`~omni_actors.actors.engines.qwen3_omni.code2wav_model`); they need the next frame to be
exact, so each chunk holds them back. Per segment (one ``generate`` call) it yields:

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

Truncation. code2wav keeps no conversation state: each reply is an utterance of its own.
It only remembers, per session until release or abort, how many frames its last reply
had, so that :meth:`Code2WavEngine.truncate` can tell the talker which frames the samples
the user heard depend on.

Serving and abort. The engine is a
:class:`~omni_actors.actors.engines.stepped_engine.SteppedTorchEngine`: every session's
windows are work on its one :class:`~omni_actors.actors.engines.step_loop.StepLoop`, as
the thinker's and talker's forwards are. A window is one row (a single-position work):
each step takes the waiting window of every session that has one, up to ``max_batch``,
and runs one forward per window length among them (the decoder has no mask, and
right-padding, though harmless to a causal model's emitted samples, would change the
held-back tail), so sessions speaking at once share forwards. code2wav keeps no KV
cache: a session's request holds nothing on the device (its slot is only its place in
the loop's table, ``max_sessions`` of them) and the loop's count of its positions is
the windows it decoded, which nothing bounds. Session state, abort, release and stop
are the base's. An aborted session ends at once, even while its window waits for a step
or runs in one (its row is dropped; the others' are not). A failed step fails every
session with a window in it.

CUDA graphs. On a GPU a window's forward is launch-bound at small batches, so windows of
the shapes a streamed edge cuts over and over (its first chunk, its steady window, the
few windows of growing context between them) replay from CUDA graphs per batch bucket
(:class:`~omni_actors.actors.engines.qwen3_omni.code2wav_model.Code2WavModel`). The
engine learns those shapes from the stream: a window shape (frames, left context) that
another window of its segment followed is not a segment's last chunk, so it recurs, and
later windows of that shape are graphed; last chunks, of any length, stay eager. A
shape's graphs are captured the first time a batch of that bucket needs them, or at
load for the shapes ``warm_windows`` names.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from omni_actors.actors.engines.contract import CONTEXT_FIELD, Fields, Rule
from omni_actors.actors.engines.qwen3_omni.code2wav_model import Code2WavModel, Piece
from omni_actors.actors.engines.qwen3_omni.family import DEFAULT_RELEASE
from omni_actors.actors.engines.qwen3_omni.graphs import DEFAULT_BUCKETS
from omni_actors.actors.engines.step_loop import Chunk, Request
from omni_actors.actors.engines.stepped_engine import StepLoopArgs, SteppedTorchEngine
from omni_actors.actors.engines.torch_engine import AbortSignal, DeviceArgs, release_dir
from omni_actors.errors import EngineError
from omni_actors.models.family import WeightsArgs

__all__ = [
    "Code2WavArgs",
    "Code2WavEngine",
    "Code2WavInputError",
    "EngineStoppedError",
    "WindowShape",
]

_INTEGER: Final = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
# A session's loop positions count its windows; no KV cache holds them, so none bound them.
_UNBOUNDED: Final = sys.maxsize


class Code2WavInputError(EngineError, ValueError):
    """An input chunk is not a window of codec frames this decoder can take."""


class EngineStoppedError(EngineError):
    """The engine is not started (or was stopped): start it before generating."""


class WindowShape(BaseModel):
    """A window of ``frames`` codec frames, the first ``left_context`` of them context.

    A chunk policy (``initial_frames`` i, ``frames`` n, ``left_context`` c) cuts a first
    window (i, 0), windows (s + n, s) while the stream position s is below c, then
    steady windows (c + n, c): the qwen3-omni presets' (4, 25, 72) cuts (4, 0), (29, 4),
    (54, 29), (79, 54) and (97, 72).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    frames: int = Field(ge=1)
    left_context: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _context_within(self) -> WindowShape:
        if self.left_context >= self.frames:
            raise ValueError(
                f"left_context ({self.left_context}) must be below frames ({self.frames})"
            )
        return self


class Code2WavArgs(WeightsArgs, DeviceArgs):
    """code2wav's arguments: ``seed`` and ``cache_dir`` locate its weights.

    Attributes:
        max_batch: the most windows per step (so per forward).
        max_sessions: sessions holding state at once (a running reply, or a last
            reply's length until release); a new one past it fails with
            ``SlotsExhaustedError``. Nothing is kept on the device per session.
        batch_wait_ms: how long an idle step loop, once woken, gathers windows before
            its first step.
        cuda_graphs: on a GPU, replay windows of recurring shapes from CUDA graphs.
        graph_batches: the batch buckets graphs are captured for (a batch runs as the
            smallest that holds it; above the largest, eager).
        warm_windows: window shapes whose graphs are captured at load on a GPU, for
            every bucket up to ``max_batch``'s, so no window waits for a capture: the
            shapes the talker edge's chunk policy cuts (see :class:`WindowShape`).
    """

    max_batch: int = Field(16, ge=1)
    max_sessions: int = Field(1024, ge=1)
    batch_wait_ms: float = Field(0.0, ge=0)
    cuda_graphs: bool = True
    graph_batches: tuple[PositiveInt, ...] = Field(DEFAULT_BUCKETS, min_length=1)
    warm_windows: tuple[WindowShape, ...] = ()


@dataclass(eq=False, slots=True)
class _Session:
    """What code2wav keeps of a session: its request in the step loop, its running
    ``generate``'s signal, and how many frames its last reply had (None before one
    completed)."""

    request: Request[_Window, Piece]
    signal: AbortSignal | None = None
    reply: int | None = None


@dataclass(frozen=True, slots=True)
class _Window:
    """One window, a row of a step: its ``codes`` [Q, T], emitted from sample ``start``;
    ``common`` if its shape recurs (see the module docstring)."""

    codes: torch.Tensor
    start: int
    common: bool

    @property
    def length(self) -> int:
        """Frames in the window: only windows of one length share a forward."""
        return int(self.codes.shape[-1])


class Code2WavEngine(SteppedTorchEngine[_Session, _Window, Piece]):
    """Streams codec-frame windows to 24 kHz audio; see the module docstring.

    Args:
        args: see :class:`Code2WavArgs`.

    Raises:
        ModelNotPreparedError: the weights are not prepared.
    """

    kind: ClassVar[str] = "qwen3-omni.code2wav"
    Args: ClassVar[type[Code2WavArgs]] = Code2WavArgs
    inputs: ClassVar[dict[str, Rule]] = {"codes": "concat"}
    outputs: ClassVar[dict[str, Rule]] = {"audio": "concat"}
    streams_input: ClassVar[bool] = True

    def __init__(self, args: Code2WavArgs) -> None:
        # A window is one row: a step takes at most max_batch of them, and no prefill.
        loop = StepLoopArgs(
            max_batch=args.max_batch,
            max_sessions=args.max_sessions,
            max_tokens_per_step=args.max_batch,
            max_prefill_chunk=1,
        )
        super().__init__(
            release_dir(DEFAULT_RELEASE, args, "code2wav"),
            "code2wav",
            args.device,
            args=loop,
            max_context=_UNBOUNDED,
            wait_s=args.batch_wait_ms / 1e3,
        )
        self._args = args
        self._model: Code2WavModel | None = None
        # Window shapes (frames, left context) known to recur: filled at load (in the
        # model thread, before the loop starts), then on the event loop only.
        self._common: set[tuple[int, int]] = set()

    def _load(self, path: Path) -> None:
        args = self._args
        graphs = args.cuda_graphs and self.device.type == "cuda"
        model = Code2WavModel(path, self.device, buckets=args.graph_batches if graphs else ())
        for shape in args.warm_windows:
            model.warm(shape.frames, shape.left_context, args.max_batch)
            self._common.add((shape.frames, shape.left_context))
        self._model = model

    @property
    def model(self) -> Code2WavModel:
        """The decoder (once started): its codebooks, codebook size and samples per frame."""
        if self._model is None:
            raise EngineStoppedError("code2wav is not started")
        return self._model

    @property
    def eager_steps(self) -> int | None:
        """Windows of a recurring shape run eager for want of a graph
        (:attr:`Code2WavModel.eager_steps`); None without graphs or before the model is
        loaded."""
        return None if self._model is None else self._model.eager_steps

    def _step(self, chunks: list[Chunk[_Window, Piece]]) -> list[Piece]:
        """Model thread: one forward per window length in the step (module docstring)."""
        assert self._model is not None
        rows: dict[int, list[int]] = {}  # window length -> its chunks' indices, in order
        for index, chunk in enumerate(chunks):
            rows.setdefault(chunk.work.payload.length, []).append(index)
        pieces: dict[int, Piece] = {}
        for indices in rows.values():
            windows = [chunks[index].work.payload for index in indices]
            codes = torch.stack([window.codes for window in windows])
            common = all(window.common for window in windows)
            decoded = self._model.decode(codes, [w.start for w in windows], common=common)
            pieces.update(zip(indices, decoded, strict=True))
        return [pieces[index] for index in range(len(chunks))]

    async def truncate(self, session: str, kept: int) -> int:
        """The user heard the first ``kept`` samples of the last reply: the frames they
        depend on, which is what the talker keeps.

        Frame ``n`` changes only samples from ``per_frame * n - pending`` on (each
        window holds its last ``pending`` samples back until the next frame is known;
        the first window emits ``per_frame * new - pending`` samples). So ``kept > 0``
        samples depend on the first ``ceil((kept + pending) / per_frame)`` frames
        (1920 and 555 for tiny-omni), capped at the reply's; none on none.

        Raises:
            ValueError: the session has no reply to truncate, or ``kept`` is negative.
        """
        state = self._sessions.get(session)
        if state is None or state.reply is None or self._model is None:
            raise ValueError(f"code2wav session {session!r} has no reply to truncate")
        if kept < 0:
            raise ValueError(f"cannot keep {kept} samples; pass 0 or more")
        model = self._model
        needed = -(-(kept + model.pending) // model.per_frame) if kept else 0
        state.reply = min(needed, state.reply)
        return state.reply

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """``{"audio": ...}`` per input chunk, then the held-back tail; see the module docstring.

        A reply that completes or is cancelled (closed at a ``yield``) becomes the one
        :meth:`truncate` cuts; a failed one leaves the previous in place. An aborted one
        (abort, release or stop meanwhile) ends at once, without its tail.

        Raises:
            Code2WavInputError: a chunk is not ``[frames, num_quantizers]`` codes in range.
            EngineStoppedError: the engine is not running.
            ValueError: ``session`` is already generating.
        """
        if not self.loop.running or self._model is None:
            raise EngineStoppedError("code2wav engine is not started")
        model = self._model
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = _Session(self.loop.open(session))
        if state.signal is not None:
            raise ValueError(f"session {session!r} is already generating")
        signal = state.signal = AbortSignal()
        tail: torch.Tensor | None = None
        frames = 0
        failed = False
        shape: tuple[int, int] | None = None  # the segment's previous window's
        try:
            while (fields := await signal.next_input(inputs)) is not None:
                taken = _window(model, fields, self._common)
                if taken is None:
                    continue
                window, new = taken
                if shape is not None:  # followed by this one: not a segment's last
                    self._common.add(shape)
                shape = (window.length, window.length - new)
                frames += new
                row = self.loop.submit(state.request, window, 1, decode=True)
                outputs = await signal.until(row)
                if outputs is None:
                    return
                (decoded,) = outputs
                if window.start == 0 and tail is not None:  # a chunk without context
                    decoded = (torch.cat((tail, decoded[0])), decoded[1])
                audio, tail = decoded
                yield {"audio": audio}
            if tail is not None and not signal.aborted:
                yield {"audio": tail}
        except Exception:
            failed = True
            raise
        finally:
            state.signal = None
            if not failed and not signal.aborted:
                state.reply = frames
            if state.reply is None and self._sessions.get(session) is state:
                del self._sessions[session]  # nothing to remember: no reply yet
                self.loop.close(state.request)


def _window(
    model: Code2WavModel, fields: Fields, common: set[tuple[int, int]]
) -> tuple[_Window, int] | None:
    """``(window of codes [Q, T] int64 from its first sample to emit, new frames)``, None
    if the input adds nothing; the window is ``common`` if its (frames, context) is.

    Checked here so a bad chunk fails its own session, not a batch of sessions.
    """
    codes = fields.get("codes")
    if not isinstance(codes, torch.Tensor):
        raise Code2WavInputError(f"code2wav needs a 'codes' tensor, got {type(codes).__name__}")
    if codes.dim() != 2 or codes.shape[1] != model.quantizers or codes.dtype not in _INTEGER:
        raise Code2WavInputError(
            f"code2wav needs integer codes [frames, {model.quantizers}], "
            f"got {codes.dtype} {tuple(codes.shape)}"
        )
    raw = fields.get(CONTEXT_FIELD)
    context = int(raw) if isinstance(raw, torch.Tensor) else 0
    if not 0 <= context <= codes.shape[0]:
        raise Code2WavInputError(f"left_context {context} outside [0, {codes.shape[0]}]")
    if context == codes.shape[0]:
        return None
    if int(codes.min()) < 0 or int(codes.max()) >= model.codebook:
        raise Code2WavInputError(f"codes must lie in [0, {model.codebook})")
    window = _Window(
        codes.to(torch.long).T.contiguous(),
        model.start(context),
        common=(codes.shape[0], context) in common,
    )
    return window, codes.shape[0] - context
