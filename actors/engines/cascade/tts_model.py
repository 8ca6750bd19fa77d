"""``SpeechModel``: Sesame CSM stepped over the slot cache (model thread).

CSM writes a frame of ``num_codebooks`` codes per 80 ms: its backbone (a Llama over
text embeddings and frames' summed codebook embeddings) picks codebook 0 from its last
hidden state, and its depth decoder writes the other codebooks from that state, one
after another, as the Qwen3-Omni talker's code predictor does. Here the backbone's
forwards are steps of the engine's :class:`~omni_actors.actors.engines.step_loop.StepLoop`
over a :class:`~omni_actors.actors.engines.qwen3_omni.slot_cache.SlotCache` (a phrase's
text is a prefill, each frame one decode row, several sessions per step), and the depth
decoder runs once per step for every row that picked a frame, batched. Codes are greedy,
so a phrase's frames are what ``CsmForConditionalGeneration.generate`` writes with
``do_sample=False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni_actors.actors.engines.qwen3_omni.slot_cache import Segment, SlotCache
from omni_actors.actors.engines.qwen3_omni.static_decode import attention_configs
from omni_actors.actors.engines.step_loop import Chunk

__all__ = ["Speech", "SpeechChunk", "SpeechModel"]


@dataclass(frozen=True, slots=True)
class Speech:
    """A work's payload: ``frames`` [n, codebooks] then ``text`` ids, fed in that order;
    with ``pick``, the frame after the last position."""

    text: tuple[int, ...] = ()
    frames: torch.Tensor | None = None
    pick: bool = True

    @property
    def length(self) -> int:
        """Positions the work feeds."""
        return len(self.text) + (0 if self.frames is None else int(self.frames.shape[0]))


SpeechChunk = Chunk[Speech, torch.Tensor | None]


class SpeechModel:
    """A CSM release, loaded in the model thread.

    Args:
        path: the checkpoint directory (``config.json``, safetensors, tokenizer).
        device: where it computes.
        slots: sessions the backbone's KV cache holds at once.
        max_context: the most positions one session holds.

    Attributes:
        tokenizer: the release's text tokenizer.
        codebooks: codes per frame.
        eos: the code that, in every codebook but the last, ends an utterance.
    """

    def __init__(self, path: Path, device: torch.device, *, slots: int, max_context: int) -> None:
        from omni_actors.actors.engines.cascade.hf import (
            AutoTokenizer,
            CsmForConditionalGeneration,
            DynamicCache,
        )
        from omni_actors.actors.engines.qwen3_omni.configs import quiet_transformers
        from omni_actors.actors.engines.torch_engine import PRETRAINED_LOCK

        with PRETRAINED_LOCK, quiet_transformers():
            self.tokenizer: Any = AutoTokenizer.from_pretrained(path)
            model = CsmForConditionalGeneration.from_pretrained(  # type: ignore[no-untyped-call,unused-ignore]
                path, use_safetensors=True
            )
        self._model: Any = model.to(device).eval()
        self._cache_type = DynamicCache
        self.device = device
        config = model.config
        self.codebooks = int(config.num_codebooks)
        self.eos = int(config.codebook_eos_token_id)
        self.bos = int(config.bos_token_id)
        # CSM's vocabulary has ids past the codec's codebooks (2051 against Mimi's 2048);
        # a frame holding one could not be decoded, so they are never picked (a trained
        # model does not pick them; random weights would).
        self._codes = int(config.codec_config.codebook_size)
        dtype = next(model.parameters()).dtype
        self.cache = SlotCache(config, slots=slots, max_len=max_context, device=device, dtype=dtype)
        self._configs = attention_configs(model.backbone_model)

    def prompt(self, text: str, speaker: int) -> tuple[int, ...]:
        """The ids of ``text`` spoken by ``speaker``, as CSM's template writes a turn
        (``[speaker]text`` between the text's begin and end tokens)."""
        ids = self.tokenizer.encode(f"[{speaker}]{text}", add_special_tokens=False)
        end = self.tokenizer.eos_token_id
        return (self.bos, *ids, *([] if end is None else [int(end)]))

    def ends(self, frame: torch.Tensor) -> bool:
        """Whether ``frame`` [codebooks] ends the utterance (CSM's stopping rule)."""
        return bool((frame[:-1] == self.eos).all())

    def _embeds(self, chunk: SpeechChunk) -> torch.Tensor:
        speech = chunk.work.payload
        model = self._model
        parts = []
        if speech.frames is not None:
            frames = speech.frames.to(self.device)
            parts.append(model.backbone_model.embed_tokens(frames[None])[0])
        if speech.text:
            ids = torch.tensor(speech.text, device=self.device)
            parts.append(model.embed_text_tokens(ids))
        whole = torch.cat(parts) if len(parts) > 1 else parts[0]
        return whole[chunk.offset : chunk.offset + chunk.length]

    @torch.no_grad()
    def step(self, chunks: list[SpeechChunk]) -> list[torch.Tensor | None]:
        """One backbone forward over every chunk, then the depth decoder over the rows
        that pick; each picking chunk's frame [codebooks] (None for the others)."""
        model = self._model
        segments = [Segment(c.request.slot, c.start, c.length) for c in chunks]
        embeds = torch.cat([self._embeds(c) for c in chunks])
        step = self.cache.step(segments)
        with step.active(self._configs):
            out = model.backbone_model(
                inputs_embeds=embeds[None],
                position_ids=step.positions[None],
                attention_mask=step.mask,
                past_key_values=step,
                use_cache=True,
            )
        wanted = [n for n, c in enumerate(chunks) if c.last and c.work.payload.pick]
        frames: list[torch.Tensor | None] = [None] * len(chunks)
        if not wanted:
            return frames
        ends = torch.tensor([c.length for c in chunks]).cumsum(0) - 1
        hidden = out.last_hidden_state[0, ends[wanted].to(self.device)]
        first = self._pick(model.lm_head(hidden))
        codes = self._depth(hidden, first).cpu()
        for row, n in enumerate(wanted):
            frames[n] = codes[row]
        return frames

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The greedy code of each row of ``logits`` [B, vocab], among the codec's."""
        return logits[:, : self._codes].float().argmax(dim=-1)

    def _depth(self, hidden: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """The depth decoder's greedy codes after codebook 0, batched: [B, codebooks]."""
        depth = self._model.depth_decoder
        cache = self._cache_type(config=depth.config)
        ids = torch.stack((torch.zeros_like(first), first), dim=1)
        codes = [first]
        out = depth(
            input_ids=ids,
            backbone_last_hidden_state=hidden,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for _ in range(self.codebooks - 1):
            code = self._pick(out.logits[:, -1])
            codes.append(code)
            if len(codes) == self.codebooks:
                break
            out = depth(
                input_ids=code[:, None], past_key_values=cache, use_cache=True, logits_to_keep=1
            )
        return torch.stack(codes, dim=1)
