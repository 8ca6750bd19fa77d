"""tiny-omni's code2wav decoder with its pending tail kept: the model surgery.

code2wav's transposed convolutions trim their last step, so HF's forward turns ``n``
frames into ``1920 * n - 555`` samples: a window's last 555 samples need the frame after
it. :func:`keep_pending_tail` turns that trim off, so a forward returns ``1920 * n``
samples: HF's, then 555 decoded as if nothing followed. :class:`Code2WavModel` decodes a
batch of windows that way and cuts each row into the audio to emit now and the samples
to hold back until the next window (or the segment's end) makes them exact.

It runs HF's forward layer group by layer group, so that before the upsampling decoder
blocks (nearly all of the cost) it can drop the part of the windows' left context those
blocks do not read (:mod:`~omni_actors.actors.engines.qwen3_omni.code2wav_reach`): a streamed
window of 25 context and 25 new frames costs about 29 frames of decoding there, not 50.

On a GPU a window's forward is bound by kernel launches at small batches (17 ms for a
window at one row, 41 ms at eight, on an H100 at full size). Windows a caller marks as
being of a common shape (a streamed edge's first chunk, its steady window) replay from
CUDA graphs, one per (batch bucket, frames, context skipped), each checked bit for bit
against the eager forward when captured
(:class:`~omni_actors.actors.engines.qwen3_omni.graphs.ShapeGraphs`); a batch runs as the
smallest bucket that holds it, padded with copies of its last row, whose output is
dropped. Other windows (an utterance's last, short chunk) run eager.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from omni_actors.actors.engines.qwen3_omni import weights
from omni_actors.actors.engines.qwen3_omni.code2wav_reach import decoder_reach
from omni_actors.actors.engines.qwen3_omni.code2wav_snake import replace_snake_activations
from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs, bucket, pad_rows
from omni_actors.actors.engines.qwen3_omni.hf import (
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
)

__all__ = ["Code2WavModel", "Piece", "WindowKey", "keep_pending_tail"]

Piece = tuple[torch.Tensor, torch.Tensor]
"""One decoded window: (audio to emit now, samples held back)."""

WindowKey = tuple[int, int, int]
"""A window graph's exact shape: (batch bucket, frames, frames of context skipped)."""


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


class Code2WavModel:
    """The prepared decoder of ``path``, tail kept; every method runs in the model thread.

    Args:
        path: the release directory.
        device: where it computes (default: the CPU).
        buckets: batch sizes window graphs are captured for; none: every window runs
            eager (on the CPU, or with graphs turned off).
        capture: how graphs are captured (see :class:`ShapeGraphs`; default: on CUDA).

    Attributes:
        quantizers: codes per frame.
        codebook: codes lie in ``[0, codebook)``.
        per_frame: samples per frame (1920).
        pending: samples each window holds back (555).
        reach_frames: frames of left context the decoder blocks read (4 for tiny-omni);
            context beyond that is dropped before them.

    Raises:
        TypeError: ``path`` holds another stage.
        RuntimeError: see :func:`keep_pending_tail`; or the layer-by-layer forward (with
            :mod:`~omni_actors.actors.engines.qwen3_omni.code2wav_snake`'s activations) differs
            from HF's (transformers changed).
    """

    def __init__(
        self,
        path: Path,
        device: torch.device | None = None,
        *,
        buckets: Sequence[int] = (),
        capture: Capture | None = None,
    ) -> None:
        # Loaded and checked on the CPU, where its kernels are deterministic and exact:
        # the checks are about the model's structure, which the device does not change.
        model = weights.load(path, "code2wav")
        if not isinstance(model, Qwen3OmniMoeCode2Wav):
            raise TypeError(f"{path} holds a {type(model).__name__}, not a code2wav stage")
        self.pending = keep_pending_tail(model)
        self.quantizers = int(model.config.num_quantizers)
        self.codebook = int(model.config.codebook_size)
        self.per_frame = int(model.total_upsample)
        self._model = model
        # Samples per frame where the decoder blocks start (after the pre-upsampling).
        self._rate = math.prod(model.config.upsampling_ratios)
        reach = decoder_reach(list(model.decoder.children())[1:])
        self.reach_frames = -(-reach // self._rate)
        probe = self._probe()
        with torch.no_grad():
            reference = model(probe)[:, 0]
        replace_snake_activations(model)
        # The layers _forward runs, taken once the activations were replaced.
        self._upsample = [b for blocks in model.upsample.children() for b in blocks.children()]
        self._first, *self._blocks = model.decoder.children()
        self._check_forward(probe, reference)
        if device is not None:
            model.to(device)  # type: ignore[arg-type]  # transformers types dtype casts only
        self._device = device or torch.device("cpu")
        self._buckets = sorted(set(buckets))
        self._graphs: ShapeGraphs[WindowKey] = ShapeGraphs("code2wav window", capture=capture)

    @property
    def graphed(self) -> list[WindowKey]:
        """The window shapes replayed from a graph, in the order they were captured."""
        return self._graphs.graphed

    @property
    def eager_steps(self) -> int | None:
        """Windows of a recurring shape run eager for want of a graph (more rows than
        the largest bucket, a shape whose graph failed or differed; an utterance's last
        chunk is eager by design, uncounted); None without graphs."""
        return self._graphs.eager_steps if self._buckets else None

    def start(self, context: int) -> int:
        """The first sample a window with ``context`` frames of left context emits: the
        first of the samples the previous window held back (0 without context)."""
        return context * self.per_frame - self.pending if context else 0

    def decode(
        self, codes: torch.Tensor, starts: list[int], *, common: bool = False
    ) -> list[Piece]:
        """Decode ``codes`` [B, Q, T]; row ``i`` emits from sample ``starts[i]`` on and
        holds back the last ``pending`` samples.

        ``common``: the windows are of a shape that recurs (not an utterance's last
        chunk), worth a graph: the batch replays from its bucket's graph, captured now
        if it is the first of its shape. Otherwise, or above the largest bucket, eager.
        """
        skip = self._skip(min(starts))
        step = functools.partial(self._forward, skip=skip)
        size = bucket(codes.shape[0], self._buckets) if common and self._buckets else None
        if not (common and self._buckets):
            wav = self._forward(codes, skip)
        elif size is None:  # more rows than the largest bucket: a fallback, counted
            wav = self._graphs.run_eager(step, codes)
        else:
            key = (size, codes.shape[-1], skip)
            wav = self._graphs(key, step, pad_rows(codes, size))[: codes.shape[0]]
        cut = wav.shape[-1] - self.pending
        offset = skip * self.per_frame
        # Copies, so an output does not keep the whole batch's waveform alive; in float32
        # whatever the release's dtype, as a stage's audio is (``engine_outputs``).
        return [
            (
                wav[i, s - offset : cut].to(torch.float32, copy=True),
                wav[i, cut:].to(torch.float32, copy=True),
            )
            for i, s in enumerate(starts)
        ]

    def warm(self, frames: int, context: int, rows: int) -> None:
        """Capture the graphs of windows of ``frames`` frames (``context`` of them left
        context) for every bucket up to the one that holds ``rows`` (all of them above
        the largest), so no such window waits for a capture later. Nothing without
        buckets.

        Raises:
            ValueError: ``context`` is not below ``frames``, or ``rows`` is below 1.
        """
        if not 0 <= context < frames:
            raise ValueError(f"left context must lie in [0, {frames}) frames, got {context}")
        top = bucket(rows, self._buckets) or max(self._buckets, default=0)
        skip = self._skip(self.start(context))
        step = functools.partial(self._forward, skip=skip)
        gen = torch.Generator().manual_seed(frames)
        for size in (b for b in self._buckets if b <= top):
            shape = (size, self.quantizers, frames)
            codes = torch.randint(0, self.codebook, shape, generator=gen).to(self._device)
            self._graphs.capture((size, frames, skip), step, codes)

    def _skip(self, start: int) -> int:
        """Frames of context the decoder blocks need not see when the first sample
        emitted is ``start``."""
        return max(0, start // self.per_frame - int(self.reach_frames))

    def _forward(self, codes: torch.Tensor, skip: int) -> torch.Tensor:
        """HF's ``Qwen3OmniMoeCode2Wav.forward`` for ``codes`` [B, Q, T] -> [B, samples],
        with the first ``skip`` frames left out of the decoder blocks (and the output)."""
        model = self._model
        with torch.no_grad():
            hidden = model.code_embedding(codes + model.code_offset).mean(1)
            hidden = model.pre_transformer(inputs_embeds=hidden).last_hidden_state
            hidden = hidden.permute(0, 2, 1)
            for block in self._upsample:
                hidden = block(hidden)
            hidden = self._first(hidden)[..., skip * self._rate :]
            for block in self._blocks:
                hidden = block(hidden)
            wav: torch.Tensor = hidden.clamp(min=-1, max=1)[:, 0]
            return wav

    def _probe(self) -> torch.Tensor:
        """Random codes [1, Q, T] long enough to skip context in."""
        gen = torch.Generator().manual_seed(0)
        shape = (1, self.quantizers, 2 * self.reach_frames + 6)
        return torch.randint(0, self.codebook, shape, generator=gen)

    def _check_forward(self, probe: torch.Tensor, reference: torch.Tensor) -> None:
        """The layer-by-layer forward gives HF's samples for ``probe`` (``reference``), and
        skipping context up to the reach leaves the emitted ones as they were."""
        same = torch.equal(self._forward(probe, 0), reference)
        skip = probe.shape[-1] - self.reach_frames - 2
        exact = self.reach_frames * self.per_frame  # the first sample a window may emit
        cut = self._forward(probe, skip)[:, exact:]
        kept = torch.allclose(cut, reference[:, skip * self.per_frame + exact :], atol=1e-6, rtol=0)
        if not (same and kept):
            raise RuntimeError(
                f"code2wav decoded layer by layer differs from its forward (equal: {same}; "
                f"with {skip} frames of context skipped: {kept}); "
                "transformers' Qwen3OmniMoeCode2Wav changed"
            )
