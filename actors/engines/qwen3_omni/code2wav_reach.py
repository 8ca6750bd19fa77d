"""How far back code2wav's convolutional decoder reads, so a window's left context can be
dropped before the expensive layers.

A streamed window carries left context (25 frames in the presets) because the
pre-transformer and the first layers look that far back. The upsampling decoder blocks
after them run at 32 to 1920 samples per frame and cost nearly all of a forward, yet
their causal convolutions read only a few frames back. :func:`decoder_reach` walks those
modules from the output backwards and returns how many input samples before an output
sample it depends on; :class:`~omni_actors.actors.engines.qwen3_omni.code2wav_model.Code2WavModel`
cuts the context to that many frames just before the decoder blocks. The samples it
emits are unchanged (checked on a probe at load); the work on the context is not done.

Only the module types code2wav is built from are known here. Any other raises, so a
transformers release that changes the decoder fails loading instead of emitting audio
computed from too little context.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from omni_actors.actors.engines.qwen3_omni.hf import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavDecoderResidualUnit,
    Qwen3OmniMoeSnakeBeta,
)

__all__ = ["decoder_reach"]


def decoder_reach(modules: Iterable[torch.nn.Module]) -> int:
    """Input samples before an output sample that it depends on, for ``modules`` applied
    in order (causal layers only: none reads earlier samples than this).

    Raises:
        RuntimeError: a module is not one of code2wav's decoder layers.
    """
    return _chain(list(modules), 0)


def _chain(modules: Sequence[torch.nn.Module], need: int) -> int:
    """Samples needed at the input of ``modules`` for ``need`` at their output."""
    for module in reversed(modules):
        need = _reach(module, need)
    return need


def _reach(module: torch.nn.Module, need: int) -> int:
    if isinstance(module, Qwen3OmniMoeSnakeBeta):  # elementwise
        return need
    if isinstance(module, Qwen3OmniMoeCausalConvNet):
        # Output t reads padded inputs [t*s, t*s + k): original [t*s - (k - s), t*s + s).
        stride, kernel = int(module.stride), int(module.kernel_size)
        return need * stride + kernel - stride
    if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
        # Output t (after the left trim of kernel - stride) reads inputs from
        # ceil((t + 1) / s) - 1 on, whatever the kernel; one more sample is a margin.
        return -(-need // int(module.conv.stride[0])) + 1
    if isinstance(module, Qwen3OmniMoeCode2WavDecoderResidualUnit):  # x + f(x)
        return _chain((module.act1, module.conv1, module.act2, module.conv2), need)
    if isinstance(module, Qwen3OmniMoeCode2WavDecoderBlock):
        return _chain(list(module.block), need)
    raise RuntimeError(
        f"code2wav decoder layer {type(module).__name__} is unknown: cannot tell how far "
        "back it reads; transformers' Qwen3OmniMoeCode2Wav changed"
    )
