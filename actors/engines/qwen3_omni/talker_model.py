"""``TalkerModel``: the loaded talker and every forward the talker engine runs.

Everything here runs in the engine's model thread (``TorchEngine.call``), one call at a
time. Prefills run per session, on its :class:`Voice`; :meth:`TalkerModel.frames` steps
the replies of several sessions in one call: one talker forward over their caches
(left-padded, :mod:`.batched_step`), then the code predictor's loop over every row at
once (its cache is fresh per frame and as long for every row, so it needs no padding).
A call with one session runs the single-session forwards of :mod:`.stepping`, so a
session stepping alone gets exactly HF's codes.

With a static slot cache (:mod:`.static_decode`) a frame is instead one step over it:
the talker step, its codec head, the first code and the code predictor's loop, all
replayed as one CUDA graph per batch and span bucket on a GPU, its backbone layers and
code-predictor steps compiled first where asked (:mod:`.frame_compile`). A reply's
frames then live in the session's slot only: the next prefill crops them away anyway,
so it drops the slot rather than settling it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import torch

from omni_actors.actors.engines.qwen3_omni import layout, stepping, weights
from omni_actors.actors.engines.qwen3_omni.batched_step import talker_steps
from omni_actors.actors.engines.qwen3_omni.code_predictor_graph import GraphedCodePredictor
from omni_actors.actors.engines.qwen3_omni.frame_compile import (
    CompiledCodePredictor,
    CompiledLayers,
    FrameCompile,
)
from omni_actors.actors.engines.qwen3_omni.hf import (
    DynamicCache,
    PreTrainedConfig,
    Qwen3OmniMoeTalkerForConditionalGeneration,
)
from omni_actors.actors.engines.qwen3_omni.static_decode import StaticDecoder, StaticPlan, StepCache
from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.errors import ModelFileError

__all__ = ["PREFIX", "Frame", "FrameStep", "Speech", "TalkerModel", "Voice"]

PREFIX: Final = 9
"""Positions of the assistant prefix (``stepping.talker_assistant_prefix``)."""

Frame = tuple[torch.Tensor, torch.Tensor] | None
"""``(codes [1, G], next_input [1, 1, Ht])`` of one frame, or None at codec EOS."""


@dataclass
class Voice:
    """One session's talker state, kept across responses until release or abort.

    ``cache`` holds the conversation's user parts in its first ``user`` positions, then
    possibly the last reply's assistant part, which the next model call crops away.
    ``user`` is only changed in the model thread (a prefill still running there when its
    response was cancelled keeps it in step with the cache), except by a failed
    response's rollback, when nothing that changes it can still be running.
    """

    cache: DynamicCache
    user: int = 0
    reply: int | None = None
    """Tokens of the last reply (what ``truncate`` caps at); None before the first."""
    signal: AbortSignal | None = None
    """Set while a response is generating."""

    def crop(self) -> None:
        """Model thread: drop whatever follows the user parts.

        Layer by layer: a forward that failed part-way leaves its first layers longer.
        A negative ``crop`` removes that many positions on every supported transformers
        release (a positive one changed meaning across them).
        """
        # Typed differently across releases; each has get_seq_length and crop.
        layers: list[Any] = list(self.cache.layers)
        for layer in layers:
            extra = int(layer.get_seq_length()) - self.user
            if extra > 0:
                layer.crop(-extra)


@dataclass
class Speech:
    """One reply's frame loop state: the next position to fill."""

    cache: DynamicCache
    position: int


@dataclass(frozen=True, slots=True)
class FrameStep:
    """One session's next frame: the previous frame's codes embedded, this frame's text."""

    speech: Speech
    carry: torch.Tensor
    """[1, 1, Ht] the previous frame's ``next_input``."""
    text: torch.Tensor
    """[1, H] the frame's text input (``ReplyInput.text``)."""


class TalkerModel:
    """The talker of a prepared tiny-omni directory, loaded (in the model thread).

    Args:
        path: the release directory (:mod:`.weights`).
        stop_at_codec_eos: let a frame end the reply at codec EOS (else EOS is masked).
        static: step frames over a static slot cache so built; None: eagerly over the
            sessions' own caches.
        frame_compile: what of the static frame step to ``torch.compile`` (None:
            nothing); without ``static``, nothing is.

    Attributes:
        text_config: the text model's config (what a session's ``DynamicCache`` needs).
        speakers: codec id per voice name (lower case): the checkpoint's
            ``talker_config.speaker_id``.
    """

    def __init__(
        self,
        path: Path,
        device: torch.device | None = None,
        *,
        stop_at_codec_eos: bool,
        static: StaticPlan | None = None,
        frame_compile: FrameCompile | None = None,
    ) -> None:
        talker = weights.load(path, "talker", device=device)
        assert isinstance(talker, Qwen3OmniMoeTalkerForConditionalGeneration)
        # On a GPU the code predictor is launch-bound: replay it from CUDA graphs.
        self._code_frame: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
        if device is not None and device.type == "cuda":
            graphed = GraphedCodePredictor(talker)
            graphed.warm(1)  # a lone session's first frame does not wait for a capture
            self._code_frame = graphed
        else:
            self._code_frame = functools.partial(stepping.code_predictor_frame, talker)
        self._talker = talker
        self._stop_at_codec_eos = stop_at_codec_eos
        cfg = talker.config
        self.text_config = cast(PreTrainedConfig, cfg.text_config)
        speakers = cfg.speaker_id
        if not isinstance(speakers, dict) or not speakers:
            problem = f"has no talker_config.speaker_id voices (found {speakers!r})"
            raise ModelFileError(path / "config.json", problem, layout.REBUILD)
        self.speakers = {str(name).lower(): int(code) for name, code in speakers.items()}
        self._vocab = int(self.text_config.vocab_size)
        self._codec_eos = int(cfg.codec_eos_token_id)
        self._static: StaticDecoder | None = None
        self._layers: CompiledLayers | None = None
        self._predictor: CompiledCodePredictor | None = None
        if static is not None and frame_compile is not None:
            if frame_compile.backbone:
                self._layers = CompiledLayers(talker.model.layers, frame_compile.backend)
            if frame_compile.predictor:
                self._predictor = CompiledCodePredictor(
                    talker, frame_compile.backend, fused=frame_compile.fused
                )
        if static is not None:
            self._static = StaticDecoder(
                talker.model,
                self.text_config,
                self._static_frame,
                slots=static.slots,
                max_len=static.max_len,
                device=device or torch.device("cpu"),
                dtype=next(talker.parameters()).dtype,
                graphs=static.graphs,
                name="talker frame",
            )
            if static.warm:
                dtype = next(talker.parameters()).dtype
                width = int(self.text_config.hidden_size)
                text = int(cfg.thinker_hidden_size)
                self._static.warm([((1, width), dtype), ((text,), dtype)])

    @property
    def talker(self) -> Qwen3OmniMoeTalkerForConditionalGeneration:
        """The HF talker (tests reach its layers to inject failures)."""
        return self._talker

    def _user_part(self, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return stepping.talker_user_part(self._talker, rows[None], rows[None], mask[None])

    @torch.no_grad()
    def prefill_user(self, voice: Voice, rows: torch.Tensor, mask: torch.Tensor) -> None:
        """Append user rows to the session's user parts."""
        self._drop(voice)
        voice.crop()
        stepping.talker_forward(self._talker, self._user_part(rows, mask), voice.cache, voice.user)
        voice.user += rows.shape[0]

    def take_back(self, voice: Voice, count: int) -> None:
        """The session's last ``count`` user positions go (the thinker took their rows
        back): cropped now, as a rollback crops them."""
        self._drop(voice)
        voice.user -= count
        voice.crop()

    @torch.no_grad()
    def open(
        self,
        voice: Voice,
        rows: torch.Tensor,
        mask: torch.Tensor,
        opening: torch.Tensor,
        tts: torch.Tensor,
        first: torch.Tensor,
        speaker: int,
    ) -> tuple[Speech, Frame]:
        """Prefill the user rows left + the assistant prefix (holding token 0); frame 0."""
        self._drop(voice)
        voice.crop()
        talker = self._talker
        first_four = torch.cat((opening, first))[None]
        bos_pad = (tts[None, 0:1], tts[None, 2:3])
        inputs = stepping.talker_assistant_prefix(talker, first_four, bos_pad, speaker)
        if rows.shape[0]:
            inputs = torch.cat((self._user_part(rows, mask), inputs), dim=1)
        hidden, logits = stepping.talker_forward(talker, inputs, voice.cache, voice.user)
        voice.user += rows.shape[0]
        (frame,) = self._complete(hidden, logits)
        return Speech(voice.cache, voice.user + PREFIX), frame

    @torch.no_grad()
    def frames(self, steps: list[FrameStep], *, eager: bool = False) -> list[Frame]:
        """One talker step per session (the previous frame's codes plus this frame's
        text), all in one forward, then each row's codes: over the static cache when
        there is one and the sessions fit it, unless ``eager`` (a benchmark compares)."""
        talker = self._talker
        carry = torch.cat([step.carry for step in steps])
        text = torch.cat([step.text for step in steps])
        speeches = [step.speech for step in steps]
        positions = [speech.position for speech in speeches]
        if not eager and self._static is not None and self._static.fits(positions):
            caches = [speech.cache for speech in speeches]
            codes, carries = self._static.run(caches, positions, [carry, text])
            for speech in speeches:
                speech.position += 1
            ends = (codes[:, 0] == self._codec_eos).tolist()
            return [
                None if end else (codes[row : row + 1], carries[row : row + 1])
                for row, end in enumerate(ends)
            ]
        if self._static is not None:
            for speech in speeches:
                self._static.settle(speech.cache)
        inputs = carry + talker.text_projection(text[:, None])
        if len(steps) == 1:
            (speech,) = speeches
            hidden, logits = stepping.talker_forward(talker, inputs, speech.cache, speech.position)
        else:
            caches = [speech.cache for speech in speeches]
            positions = [speech.position for speech in speeches]
            hidden, logits = talker_steps(talker, inputs, caches, positions)
        for speech in speeches:
            speech.position += 1
        return self._complete(hidden, logits)

    @property
    def static(self) -> StaticDecoder | None:
        """The static slot cache decode steps run over, if any."""
        return self._static

    @property
    def compiled(self) -> dict[str, str]:
        """Per region of the static frame step (``layers``, ``code_predictor``):
        ``compiled``, ``off``, or why it runs uncompiled after its compile failed."""
        regions = {"layers": self._layers, "code_predictor": self._predictor}
        return {
            name: "off"
            if region is None
            else "compiled"
            if region.state.failed is None
            else f"failed: {region.state.failed}"
            for name, region in regions.items()
        }

    def _drop(self, voice: Voice) -> None:
        """Forget the frames the last reply stepped in a static slot (cropped next)."""
        if self._static is not None:
            self._static.drop(voice.cache)

    def _static_frame(
        self, cache: StepCache, positions: torch.Tensor, carry: torch.Tensor, text: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The static frame step: ``(codes [B, groups], next_input [B, 1, Ht])``, codes
        of a row at codec EOS start with EOS (the caller ends that reply)."""
        talker = self._talker
        inputs = carry + talker.text_projection(text[:, None])
        layers = self._layers.active() if self._layers is not None else contextlib.nullcontext()
        with layers:
            out = talker.model(
                inputs_embeds=inputs,
                attention_mask=cache.mask,
                position_ids=positions[:, None],
                past_key_values=cache,
                use_cache=True,
            )
        hidden = out.last_hidden_state[:, -1:]
        masked = stepping.mask_codec_logits(
            talker.codec_head(hidden)[:, -1], self._vocab, self._codec_eos
        )
        if not self._stop_at_codec_eos:
            masked[..., self._codec_eos] = float("-inf")
        code0 = stepping.greedy(masked)
        if self._predictor is not None:
            return self._predictor(hidden, code0)
        return stepping.code_predictor_frame(talker, hidden, code0)

    def _complete(self, hidden: torch.Tensor, logits: torch.Tensor) -> list[Frame]:
        """Each row's frame from its talker step's ``hidden`` [B, 1, Ht] and ``logits``:
        its first code, then the code predictor's (batched over the rows that speak)."""
        masked = stepping.mask_codec_logits(logits, self._vocab, self._codec_eos)
        if not self._stop_at_codec_eos:
            masked[..., self._codec_eos] = float("-inf")
        code0 = stepping.greedy(masked)
        speaking = code0[:, 0] != self._codec_eos
        frames: list[Frame] = [None] * code0.shape[0]
        rows = speaking.nonzero()[:, 0].tolist()
        if not rows:
            return frames
        if len(rows) < len(frames):
            hidden, code0 = hidden[speaking], code0[speaking]
        codes, carry = self._code_frame(hidden, code0)
        for index, row in enumerate(rows):
            frames[row] = (codes[index : index + 1], carry[index : index + 1])
        return frames
