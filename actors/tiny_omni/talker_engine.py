"""``TalkerEngine``: tiny-omni's talker, one codec frame per output, streaming or not.

The talker turns the thinker's answer into codec frames. Per segment it prefills the
user turn (from the thinker's ``prompt``) and the 9-position assistant prefix (which
already holds the first text token), then steps one frame at a time: frame ``k``'s text
input is token ``k``'s embedding while ``k < N``, then TTS_EOS once, then TTS_PAD — HF's
``generate`` schedule, so the codes equal HF's for the same thinker output.

It starts as soon as the prompt and the first token are in, and never guesses ahead:
when frame ``k`` needs token ``k`` and that has not arrived, it waits for the next input
chunk. The total ``N`` is only known once the input ended, so the output does not depend
on how the thinker's output was chunked (one token per chunk on a ``stream`` edge, one
chunk with everything on a ``full`` edge): every frame runs the same forwards on the same
tensors either way.

Codec EOS is suppressed by default, so a segment is exactly ``frames_per_token * N``
frames long (the length the pipeline plans for); the random weights *do* pick EOS now
and then (e.g. at frame 44 of 96 for "Hello there!"). Every frame HF would produce is the same
either way; with ``stop_at_codec_eos`` the segment ends at EOS, as HF and a real
checkpoint do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Final, cast

import torch
from pydantic import Field, field_validator

from omni_actors.actors.engine import Fields, Rule
from omni_actors.actors.tiny_omni import configs, stepping, weights
from omni_actors.actors.tiny_omni.family import TINY_OMNI
from omni_actors.actors.tiny_omni.hf import (
    DynamicCache,
    PreTrainedConfig,
    Qwen3OmniMoeTalkerForConditionalGeneration,
)
from omni_actors.actors.tiny_omni.thinker_engine import ASSISTANT_OPENING
from omni_actors.actors.torch_engine import AbortSignal, TorchEngine, stage_dir
from omni_actors.model_family import WeightsArgs

__all__ = ["TalkerArgs", "TalkerEngine"]

_OPENING: Final = len(ASSISTANT_OPENING)


class TalkerArgs(WeightsArgs):
    """The talker's arguments: ``seed`` and ``cache_dir`` locate its weights.

    Attributes:
        frames_per_token: the segment yields that many codec frames per thinker token.
        speaker: the voice (``chelsie``, ``ethan``, ``aiden``).
        stop_at_codec_eos: end the segment when the talker picks codec EOS (default: EOS
            is masked, see the module docstring).
    """

    frames_per_token: int = Field(2, ge=1)
    speaker: str = "chelsie"
    stop_at_codec_eos: bool = Field(False, strict=True)

    @field_validator("speaker")
    @classmethod
    def _known_speaker(cls, speaker: str) -> str:
        if speaker.lower() not in configs.SPEAKERS:
            raise ValueError(f"unknown speaker {speaker!r}; known: {sorted(configs.SPEAKERS)}")
        return speaker.lower()


Frame = tuple[torch.Tensor, torch.Tensor] | None
"""``(codes [1, G], next_input [1, 1, Ht])`` of one frame, or None at codec EOS."""


@dataclass
class _Speech:
    """One segment's talker state: its KV cache and the next position to fill."""

    cache: DynamicCache
    position: int


@dataclass
class _Received:
    """What the thinker has sent in this segment so far."""

    prompt: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None
    tts: torch.Tensor | None = None
    embeds: list[torch.Tensor] = field(default_factory=list)
    """[1, H] per token, in order."""
    ended: bool = False

    def take(self, fields: Fields) -> None:
        """Keep one input chunk's fields."""
        for name in ("prompt", "prompt_mask", "tts"):
            value = fields.get(name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value)
        embed = fields.get("embed")
        if isinstance(embed, torch.Tensor) and embed.numel():
            self.embeds.extend(torch.split(embed.reshape(-1, embed.shape[-1]), 1))

    def known(self, frame: int) -> bool:
        """Whether frame ``frame``'s text input can be told yet."""
        return self.ended or frame < len(self.embeds)

    def text(self, frame: int) -> torch.Tensor:
        """Frame ``frame``'s text input [1, H]: its token, then TTS_EOS once, then TTS_PAD."""
        if frame < len(self.embeds):
            return self.embeds[frame]
        assert self.tts is not None, "checked before the first frame"
        return self.tts[1:2] if frame == len(self.embeds) else self.tts[2:3]


class TalkerEngine(TorchEngine):
    """Codec frames for the thinker's tokens (see the module docstring).

    Inputs (any subset per chunk): ``prompt`` [L, H] and ``prompt_mask`` [L] bool and
    ``tts`` [3, H] (the thinker's first output carries them), ``embed`` [n, H] (one row
    per token). Outputs: ``codes`` [1, G] int64, one frame
    each, every code in ``[0, codebook_size)``.

    Args:
        args: see :class:`TalkerArgs`.

    Raises:
        ModelNotPreparedError: the weights are not prepared.
    """

    kind: ClassVar[str] = "tiny-omni.talker"
    Args: ClassVar[type[TalkerArgs]] = TalkerArgs
    inputs: ClassVar[dict[str, Rule]] = {
        "prompt": "replace",
        "prompt_mask": "replace",
        "tts": "replace",
        "embed": "concat",
    }
    outputs: ClassVar[dict[str, Rule]] = {"codes": "concat"}
    streams_input: ClassVar[bool] = True

    def __init__(self, args: TalkerArgs) -> None:
        self.frames_per_token = args.frames_per_token
        self.stop_at_codec_eos = args.stop_at_codec_eos
        self.speaker = args.speaker
        super().__init__(stage_dir(TINY_OMNI.name, args, "talker"), "talker")
        self._sessions: dict[str, AbortSignal] = {}

    def _load(self, path: Path) -> None:
        talker = weights.load(path)
        assert isinstance(talker, Qwen3OmniMoeTalkerForConditionalGeneration)
        self._talker = talker
        cfg = talker.config
        self._text_config = cast(PreTrainedConfig, cfg.text_config)
        self._speaker_id = int((cfg.speaker_id or configs.SPEAKERS)[self.speaker])
        self._vocab = int(self._text_config.vocab_size)
        self._codec_eos = int(cfg.codec_eos_token_id)

    @property
    def active_sessions(self) -> set[str]:
        """Sessions with a running ``generate`` (the talker keeps nothing in between)."""
        return set(self._sessions)

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """``frames_per_token * N`` frames for the segment's ``N`` tokens.

        Fewer only with ``stop_at_codec_eos`` when the talker picks codec EOS (as the
        real model ends its speech): the segment then ends at once, its remaining input
        left unread for the stage to drain.

        Raises:
            ValueError: the session is already generating, or tokens came without the
                ``prompt``/``prompt_mask``/``tts`` the first frame needs.
        """
        if session in self._sessions:
            raise ValueError(f"session {session!r} is already generating")
        signal = self._sessions[session] = AbortSignal()
        got = _Received()
        step: asyncio.Future[Frame] | None = None
        try:
            if not await self._wait_for(signal, inputs, got, 0):
                return
            if not got.embeds:
                return  # the thinker said nothing: no speech
            if got.prompt is None or got.prompt_mask is None or got.tts is None:
                raise ValueError(
                    "talker input lacks prompt, prompt_mask or tts: the thinker -> talker "
                    "edge must carry them with embed"
                )
            speech, frame = await self.call(
                self._open, got.prompt, got.prompt_mask, got.tts, got.embeds[0]
            )
            produced = 0
            while frame is not None and not signal.aborted:
                codes, carry = frame
                produced += 1
                if got.known(produced) and not self._done(got, produced):
                    # Start the next frame before handing this one out (see the thinker).
                    step = asyncio.ensure_future(
                        self.call(self._frame, speech, carry, got.text(produced))
                    )
                yield {"codes": codes}
                if step is None:
                    if not await self._wait_for(signal, inputs, got, produced):
                        return
                    if self._done(got, produced):
                        return
                    step = asyncio.ensure_future(
                        self.call(self._frame, speech, carry, got.text(produced))
                    )
                frame = await step
                step = None
        finally:
            if step is not None and not step.done():
                step.cancel()
            if self._sessions.get(session) is signal:
                del self._sessions[session]

    def _done(self, got: _Received, produced: int) -> bool:
        return got.ended and produced >= self.frames_per_token * len(got.embeds)

    async def _wait_for(
        self, signal: AbortSignal, inputs: AsyncIterator[Fields], got: _Received, frame: int
    ) -> bool:
        """Read input until frame ``frame``'s text is known; False if aborted meanwhile."""
        while not got.known(frame):
            fields = await signal.next_input(inputs)
            if signal.aborted:
                return False
            if fields is None:
                got.ended = True
            else:
                got.take(fields)
        return not signal.aborted

    async def abort(self, session: str) -> None:
        """End ``session``'s ``generate`` at its next step; its state goes with it."""
        signal = self._sessions.pop(session, None)
        if signal is not None:
            signal.abort()

    async def release(self, session: str) -> None:
        """Nothing outlives a segment; same as :meth:`abort` if one is still running."""
        await self.abort(session)

    async def stop(self) -> None:
        """Abort every session, then end the model thread."""
        for session in list(self._sessions):
            await self.abort(session)
        await super().stop()

    # -- model thread -------------------------------------------------------------------

    @torch.no_grad()
    def _open(
        self, prompt: torch.Tensor, mask: torch.Tensor, tts: torch.Tensor, first: torch.Tensor
    ) -> tuple[_Speech, Frame]:
        """Prefill user turn + assistant prefix (holding token 0) and make frame 0."""
        talker = self._talker
        user = prompt[None, :-_OPENING]
        user_part = stepping.talker_user_part(talker, user, user, mask[None, :-_OPENING])
        first_four = torch.cat((prompt[-_OPENING:], first))[None]
        bos_pad = (tts[None, 0:1], tts[None, 2:3])
        prefix = stepping.talker_assistant_prefix(talker, first_four, bos_pad, self._speaker_id)
        inputs = torch.cat((user_part, prefix), dim=1)
        speech = _Speech(DynamicCache(config=self._text_config), inputs.shape[1])
        hidden, logits = stepping.talker_forward(talker, inputs, speech.cache, 0)
        return speech, self._complete(hidden, logits)

    @torch.no_grad()
    def _frame(self, speech: _Speech, carry: torch.Tensor, text: torch.Tensor) -> Frame:
        """One talker step: the previous frame's codes plus this frame's text, then codes."""
        inputs = carry + self._talker.text_projection(text[None])
        hidden, logits = stepping.talker_forward(
            self._talker, inputs, speech.cache, speech.position
        )
        speech.position += 1
        return self._complete(hidden, logits)

    def _complete(self, hidden: torch.Tensor, logits: torch.Tensor) -> Frame:
        masked = stepping.mask_codec_logits(logits, self._vocab, self._codec_eos)
        if not self.stop_at_codec_eos:
            masked[..., self._codec_eos] = float("-inf")
        code0 = stepping.greedy(masked)
        if int(code0) == self._codec_eos:
            return None
        return stepping.code_predictor_frame(self._talker, hidden, code0)
