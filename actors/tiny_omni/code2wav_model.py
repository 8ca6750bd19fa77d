"""tiny-omni's code2wav decoder with its pending tail kept: the model surgery.

code2wav's transposed convolutions trim their last step, so HF's forward turns ``n``
frames into ``1920 * n - 555`` samples: a window's last 555 samples need the frame after
it. :func:`keep_pending_tail` turns that trim off, so a forward returns ``1920 * n``
samples: HF's, then 555 decoded as if nothing followed. :class:`Code2WavModel` decodes a
batch of windows that way and cuts each row into the audio to emit now and the samples
to hold back until the next window (or the segment's end) makes them exact.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omni_actors.actors.tiny_omni import weights
from omni_actors.actors.tiny_omni.hf import (
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
)

__all__ = ["Code2WavModel", "Piece", "keep_pending_tail"]

Piece = tuple[torch.Tensor, torch.Tensor]
"""One decoded window: (audio to emit now, samples held back)."""


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

    Attributes:
        quantizers: codes per frame.
        codebook: codes lie in ``[0, codebook)``.
        per_frame: samples per frame (1920).
        pending: samples each window holds back (555).

    Raises:
        TypeError: ``path`` holds another stage.
        RuntimeError: see :func:`keep_pending_tail`.
    """

    def __init__(self, path: Path) -> None:
        model = weights.load(path)
        if not isinstance(model, Qwen3OmniMoeCode2Wav):
            raise TypeError(f"{path} holds a {type(model).__name__}, not a code2wav stage")
        self.pending = keep_pending_tail(model)
        self.quantizers = int(model.config.num_quantizers)
        self.codebook = int(model.config.codebook_size)
        self.per_frame = int(model.total_upsample)
        self._model = model

    def decode(self, codes: torch.Tensor, starts: list[int]) -> list[Piece]:
        """Decode ``codes`` [B, Q, T]; row ``i`` emits from sample ``starts[i]`` on and
        holds back the last ``pending`` samples."""
        with torch.no_grad():
            wav = self._model(codes)[:, 0]
        cut = wav.shape[-1] - self.pending
        # Copies, so an output does not keep the whole batch's waveform alive.
        return [(wav[i, s:cut].clone(), wav[i, cut:].clone()) for i, s in enumerate(starts)]
