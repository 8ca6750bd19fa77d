"""Decode steps of several sessions in one forward, each session keeping its own KV cache.

Every session owns a ``DynamicCache`` whose length is its own (prefills, crops and
rollbacks stay per session, as :mod:`.stepping` runs them). For one decode step of
several sessions, :class:`PaddedCaches` copies their caches into one batch cache,
*left*-padded to the longest, so every row's new position lands at the same index (the
end), with a 2-D attention mask that hides the padding and each row's own position id
for the rotary embedding. Attention then sees exactly each session's own positions: a
row's result is its session's own forward up to float rounding (the batch changes the
shapes of the matrix products, so the last bits may differ, and with random weights a
near-tied greedy pick can flip). After the forward, each row's new key and value are
appended to its own session's cache.

Cost: each step copies every session's cache into the batch (and ``DynamicCache``'s
concatenation copies it once more); at tiny-omni's sizes that is small beside the
forward's fixed cost, which one forward for ``B`` sessions pays once instead of ``B``
times. A paged cache (as vLLM keeps) would avoid the copies for large models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from omni_actors.actors.engines.qwen3_omni.hf import (
    DynamicCache,
    PreTrainedConfig,
    Qwen3OmniMoeTalkerForConditionalGeneration,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

__all__ = ["PaddedCaches", "talker_steps", "thinker_steps"]


class PaddedCaches:
    """Sessions' caches as one left-padded batch for a one-position step.

    Args:
        caches: one per row; each holds at least one position in every layer.
        config: the model's text config (the batch cache's layer types).

    Attributes:
        cache: the batch cache [B, heads, longest, head_dim] per layer.
        mask: [B, longest + 1] int64, 0 at padding, 1 at each row's positions and at
            the step's new one.

    Raises:
        ValueError: a cache is empty or has sliding-window layers (whose positions a
            padded batch cannot line up); run such a model one session per step.
    """

    def __init__(self, caches: Sequence[DynamicCache], config: PreTrainedConfig) -> None:
        self._caches = list(caches)
        # Typed differently across releases; each has keys, values and is_sliding.
        rows: list[list[Any]] = [list(cache.layers) for cache in self._caches]
        if any(getattr(layer, "is_sliding", False) for layers in rows for layer in layers):
            raise ValueError("padded batching needs full-attention caches, not sliding windows")
        lengths = [int(layers[0].get_seq_length()) for layers in rows]
        if min(lengths) < 1:
            raise ValueError("every session in a padded batch needs a prefilled cache")
        longest = max(lengths)
        batch = len(self._caches)
        self.mask = torch.zeros(batch, longest + 1, dtype=torch.long)
        for row, length in enumerate(lengths):
            self.mask[row, longest - length :] = 1
        self.cache = DynamicCache(config=config)
        for index in range(len(rows[0])):
            first = rows[0][index].keys
            keys = first.new_zeros(batch, first.shape[1], longest, first.shape[3])
            values = keys.clone()
            for row, (layers, length) in enumerate(zip(rows, lengths, strict=True)):
                keys[row, :, longest - length :] = layers[index].keys[0]
                values[row, :, longest - length :] = layers[index].values[0]
            self.cache.update(keys, values, index)

    def commit(self) -> None:
        """Append each row's new position (the step's last) to its own session's cache."""
        for index, (keys, values, *_) in enumerate(self.cache):
            for row, cache in enumerate(self._caches):
                cache.update(keys[row : row + 1, :, -1:], values[row : row + 1, :, -1:], index)


def talker_steps(
    talker: Qwen3OmniMoeTalkerForConditionalGeneration,
    inputs_embeds: torch.Tensor,
    caches: Sequence[DynamicCache],
    positions: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One talker step for ``B`` sessions: ``inputs_embeds`` [B, 1, Ht], row ``i`` at
    position ``positions[i]`` of ``caches[i]``, which gets that position appended.

    Returns:
        ``(last_hidden [B, 1, Ht], logits [B, talker_vocab])``, as
        :func:`.stepping.talker_forward` returns for one session.
    """
    padded = PaddedCaches(caches, cast(PreTrainedConfig, talker.config.text_config))
    out = talker.model(
        inputs_embeds=inputs_embeds,
        attention_mask=padded.mask,
        position_ids=torch.tensor(positions)[:, None],
        past_key_values=padded.cache,
        use_cache=True,
    )
    padded.commit()
    last = out.last_hidden_state[:, -1:]
    return last, talker.codec_head(last)[:, -1]


def thinker_steps(
    thinker: Qwen3OmniMoeThinkerForConditionalGeneration,
    input_ids: torch.Tensor,
    caches: Sequence[DynamicCache],
    positions: Sequence[int],
) -> torch.Tensor:
    """One thinker decode step for ``B`` sessions: ``input_ids`` [B, 1], row ``i`` at
    position ``positions[i]`` of ``caches[i]``, which gets that position appended.

    Returns:
        logits [B, vocab] for each row's next token.
    """
    padded = PaddedCaches(caches, cast(PreTrainedConfig, thinker.config.text_config))
    out = thinker(
        input_ids=input_ids,
        attention_mask=padded.mask,
        position_ids=torch.tensor(positions)[:, None],
        past_key_values=padded.cache,
        use_cache=True,
    )
    padded.commit()
    logits: torch.Tensor = out.logits[:, -1]
    return logits
