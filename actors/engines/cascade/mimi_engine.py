"""``MimiEngine`` (kind ``cascade.mimi``): the Mimi codec's decoder, codec frames to audio.

Input: windows of codec frames as the synthesizer -> decoder edge cuts them
(``ChunkPolicy``, as the talker -> code2wav edge): ``codes`` [context + new, codebooks]
and ``left_context`` (0-d, absent when 0). Output: ``audio``, float32 1-D at the codec's
rate (24 kHz), exactly the samples of the window's new frames (1920 per frame): Mimi's
decoder is causal, so a window's new samples need only the frames before them, which
the left context carries. A window whose context covers every earlier frame (a ``full``
edge's one window) is ``MimiModel.decode`` of the whole utterance, sample for sample.
A truncation maps the samples the user heard to the frames they depend on.

``model:`` a Mimi checkpoint (``kyutai/mimi``), a CSM release (its ``codec_model``), or
nothing (tiny-cascade's). Mimi keeps no state between windows (each is decoded whole,
on the engine's model thread) but the count of the last utterance's frames.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from omni_actors.actors.engines.cascade.family import stage_checkpoint
from omni_actors.actors.engines.contract import CONTEXT_FIELD, Fields, Rule
from omni_actors.actors.engines.torch_engine import AbortSignal, DeviceArgs, TorchEngine
from omni_actors.errors import EngineError
from omni_actors.models.family import WeightsArgs

__all__ = ["MimiArgs", "MimiEngine", "MimiInputError"]


class MimiInputError(EngineError):
    """A window of codes the decoder cannot take (the message says what is wrong)."""


class MimiArgs(WeightsArgs, DeviceArgs):
    """The decoder's arguments (``model``, ``seed``, ``cache_dir`` locate it)."""


class MimiEngine(TorchEngine):
    """Audio of codec-frame windows (see the module docstring)."""

    kind: ClassVar[str] = "cascade.mimi"
    Args: ClassVar[type[MimiArgs]] = MimiArgs
    inputs: ClassVar[Mapping[str, Rule]] = {"codes": "concat"}
    outputs: ClassVar[Mapping[str, Rule]] = {"audio": "concat"}
    streams_input: ClassVar[bool] = True
    audio_rate: ClassVar[int] = 24000

    def __init__(self, args: MimiArgs) -> None:
        super().__init__(stage_checkpoint(args, "mimi"), "mimi", args.device)
        self._signals: dict[str, AbortSignal] = {}
        # Frames of each session's last utterance (completed or cancelled): what a
        # truncation maps heard samples onto.
        self._frames: dict[str, int] = {}

    def _load(self, path: Path) -> None:
        from omni_actors.actors.engines.cascade.hf import AutoConfig, MimiModel
        from omni_actors.actors.engines.qwen3_omni.configs import quiet_transformers
        from omni_actors.actors.engines.torch_engine import PRETRAINED_LOCK

        with PRETRAINED_LOCK, quiet_transformers():
            if AutoConfig.from_pretrained(path).model_type == "csm":
                from omni_actors.actors.engines.cascade.hf import CsmForConditionalGeneration

                csm = CsmForConditionalGeneration.from_pretrained(  # type: ignore[no-untyped-call,unused-ignore]
                    path, use_safetensors=True
                )
                model: Any = csm.codec_model
            else:
                model = MimiModel.from_pretrained(path, use_safetensors=True)
        self._model: Any = model.to(self.device).eval()
        config = model.config
        self.samples_per_frame = round(config.sampling_rate / config.frame_rate)
        if int(config.sampling_rate) != self.audio_rate:
            raise MimiInputError(
                f"the codec writes {config.sampling_rate} Hz audio; the cascade's decoder "
                f"stage serves {self.audio_rate} Hz codecs only"
            )

    @torch.no_grad()
    def _decode(self, codes: torch.Tensor, context: int) -> torch.Tensor:
        """Model thread: the new frames' samples of one window."""
        window = codes.to(self.device, torch.long).T[None]  # [1, codebooks, frames]
        audio: torch.Tensor = self._model.decode(window).audio_values[0, 0]
        return audio[context * self.samples_per_frame :].float().cpu().contiguous()

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """One utterance: each window's new samples, as the windows arrive."""
        signal = self._signals[session] = AbortSignal()
        frames = 0
        failed = False
        try:
            while (fields := await signal.next_input(inputs)) is not None:
                codes = fields.get("codes")
                if not isinstance(codes, torch.Tensor) or codes.numel() == 0:
                    continue
                raw = fields.get(CONTEXT_FIELD)
                context = int(raw) if isinstance(raw, torch.Tensor) else 0
                if codes.ndim != 2 or not 0 <= context < codes.shape[0]:
                    raise MimiInputError(
                        f"a window is codes [frames, codebooks] with left_context below its "
                        f"frames; got {tuple(codes.shape)} with left_context {context}"
                    )
                audio = await signal.until(self.call(self._decode, codes, context))
                if audio is None:
                    return
                frames += codes.shape[0] - context
                yield {"audio": audio}
        except Exception:
            failed = True
            raise
        finally:
            if self._signals.pop(session, None) is signal and not failed:
                self._frames[session] = frames

    async def truncate(self, session: str, kept: int) -> int:
        """The user heard the first ``kept`` samples of the last utterance: the frames
        they depend on, which is what the synthesizer keeps. Mimi's decoder is causal
        and holds nothing back, so frame ``n`` makes samples ``per_frame * n`` to
        ``per_frame * (n + 1)``: ``kept`` samples depend on the first
        ``ceil(kept / per_frame)`` frames, capped at the utterance's.

        Raises:
            ValueError: the session has no utterance to truncate, or ``kept`` is negative.
        """
        frames = self._frames.get(session)
        if frames is None:
            raise ValueError(f"mimi session {session!r} has no reply to truncate")
        if kept < 0:
            raise ValueError(f"cannot keep {kept} samples; pass 0 or more")
        self._frames[session] = min(-(-kept // self.samples_per_frame), frames)
        return self._frames[session]

    async def abort(self, session: str) -> None:
        """End ``session``'s utterance now, and forget it."""
        self._frames.pop(session, None)
        signal = self._signals.pop(session, None)
        if signal is not None:
            signal.abort()

    async def release(self, session: str) -> None:
        """Forget the session's last utterance (its frames, for a truncation)."""
        self._frames.pop(session, None)
