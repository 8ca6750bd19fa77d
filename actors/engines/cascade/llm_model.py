"""``TextModel``: a transformers causal LM stepped over the slot cache (model thread).

The cascade's LLM runs every session's forwards on one step loop, as the Qwen3-Omni
thinker does: one step feeds decode rows and prefill chunks of several sessions in one
forward over the :class:`~omni_actors.actors.engines.qwen3_omni.slot_cache.SlotCache`,
the stage's only KV cache, and picks the next token of each work that asks for one.
Any causal LM whose attention transformers routes by ``config._attn_implementation``
(Qwen3, Llama, Mistral, ...) runs so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni_actors.actors.engines.qwen3_omni.slot_cache import Segment, SlotCache
from omni_actors.actors.engines.qwen3_omni.static_decode import attention_configs
from omni_actors.actors.engines.step_loop import Chunk

__all__ = ["Feeding", "TextChunk", "TextModel"]


@dataclass(frozen=True, slots=True)
class Feeding:
    """A work's payload: the ids to feed; with ``pick``, the token after the last.

    Attributes:
        ids: the token ids fed.
        pick: pick the next token at the work's last position.
        allow_end: whether the end of turn may be picked.
    """

    ids: tuple[int, ...]
    pick: bool = False
    allow_end: bool = True


TextChunk = Chunk[Feeding, int | None]


class TextModel:
    """A causal LM release, loaded in the model thread.

    Args:
        path: the checkpoint directory (``config.json``, safetensors, tokenizer).
        device: where it computes.
        slots: sessions the KV cache holds at once.
        max_context: the most positions one session holds.
        allowed_token_ranges: half-open ``[start, stop)`` id ranges a reply may use
            (the end of turn is allowed besides); None: any.

    Attributes:
        tokenizer: the release's tokenizer.
        end: the end-of-turn id (the release's ``eos_token_id``, ``<|im_end|>``).
    """

    def __init__(
        self,
        path: Path,
        device: torch.device,
        *,
        slots: int,
        max_context: int,
        allowed_token_ranges: list[tuple[int, int]] | None = None,
    ) -> None:
        from omni_actors.actors.engines.cascade.hf import AutoModelForCausalLM, AutoTokenizer
        from omni_actors.actors.engines.qwen3_omni.configs import quiet_transformers
        from omni_actors.actors.engines.torch_engine import PRETRAINED_LOCK

        with PRETRAINED_LOCK, quiet_transformers():
            self.tokenizer: Any = AutoTokenizer.from_pretrained(path)
            model: Any = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True)
        self._model: Any = model.to(device).eval()
        self.device = device
        config = model.config
        end = getattr(model.generation_config, "eos_token_id", None) or config.eos_token_id
        self.end = int(end[0] if isinstance(end, list) else end)
        vocab = int(config.vocab_size)
        self.vocab_size = vocab
        with torch.device(device):
            allow = torch.zeros(vocab)
            if allowed_token_ranges is not None:
                allow = torch.full((vocab,), float("-inf"))
                for start, stop in allowed_token_ranges:
                    if not 0 <= start < stop <= vocab:
                        raise ValueError(
                            f"allowed_token_ranges has [{start}, {stop}), which is empty or "
                            f"outside the LLM's vocabulary [0, {vocab})"
                        )
                    allow[start:stop] = 0.0
            # Rows past the tokenizer pad the embedding (Qwen3's 151936 against its
            # tokenizer's 151669): no text has them, so no reply may pick them.
            allow[len(self.tokenizer) :] = float("-inf")
            with_end = allow.clone()
            with_end[self.end] = 0.0
            allow[self.end] = float("-inf")
            self._allow = torch.stack((allow, with_end))
        dtype = next(model.parameters()).dtype
        self.cache = SlotCache(config, slots=slots, max_len=max_context, device=device, dtype=dtype)
        self._configs = attention_configs(model.model)

    @torch.no_grad()
    def step(self, chunks: list[TextChunk]) -> list[int | None]:
        """One forward over every chunk; the picked token of each chunk that ends a
        picking work (None for the others)."""
        segments = [Segment(c.request.slot, c.start, c.length) for c in chunks]
        ids = [i for c in chunks for i in c.work.payload.ids[c.offset : c.offset + c.length]]
        step = self.cache.step(segments)
        with step.active(self._configs):
            out = self._model.model(
                input_ids=torch.tensor([ids], device=self.device),
                position_ids=step.positions[None],
                attention_mask=step.mask,
                past_key_values=step,
                use_cache=True,
            )
        wanted = [n for n, c in enumerate(chunks) if c.last and c.work.payload.pick]
        picks: list[int | None] = [None] * len(chunks)
        if not wanted:
            return picks
        ends = torch.tensor([c.length for c in chunks]).cumsum(0) - 1
        rows = out.last_hidden_state[0, ends[wanted].to(self.device)]
        logits = self._model.lm_head(rows).float()
        allow_end = torch.tensor(
            [chunks[n].work.payload.allow_end for n in wanted], device=self.device
        )
        tokens = (logits + self._allow[allow_end.long()]).argmax(dim=-1).tolist()
        for n, token in zip(wanted, tokens, strict=True):
            picks[n] = int(token)
        return picks
