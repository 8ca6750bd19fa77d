"""The static-cache pieces of a decode step: its arguments, and the grouped attention.

A stage's decode steps run over a cache allocated once at load, so that they can be
replayed from CUDA graphs (at full size a decode step is bound by kernel launches: 70 ms
eager for the 30B thinker, 13 ms replayed). The thinker and the talker keep their
sessions in a :class:`~.slot_cache.SlotCache` (:class:`StaticDecodeArgs` are its
settings); :class:`StepCache` is the cache of a step of one position per row over
tensors of the step's own, as the code predictor's compiled step uses it
(:mod:`.frame_compile`): each row writes its new key and value at its own position (an
indexed write, no host sync) and attends its own positions through a mask computed from
the positions tensor.

Attention in such a step groups each key/value head's query heads along the query axis:
one position per row means every query head of a group reads the same keys under the
same mask, so no key or value is repeated per query head (transformers' masked SDPA
path would copy the cache eight times per layer at the thinker's sizes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import torch
from pydantic import BaseModel, Field

from omni_actors.actors.engines.qwen3_omni.hf import (
    AttentionInterface,
)

__all__ = [
    "FUSED_MIN_BLOCKS",
    "PrefillGraphArgs",
    "StaticDecodeArgs",
    "StaticPlan",
    "StepCache",
    "attention_configs",
    "grouped_attention",
    "grouped_attention_of",
    "grouped_decode_attention",
    "matmul_attention",
]

_ATTENTION: Final = "omni-actors-static-decode"


class StaticDecodeArgs(BaseModel):
    """The arguments of an engine whose sessions hold slots of a :class:`~.slot_cache.SlotCache`.

    Attributes:
        static_cache: replay steps of one position per session (decode steps, frames)
            from CUDA graphs; None: on a GPU. Without, they run eagerly over the same
            slots.
        max_context: the most positions a session may hold in its slot (past it, a
            response fails with ``ContextLengthError``). The cache takes
            ``(max_sessions + 1) * max_context`` positions of every layer.
        warm_graphs: on a GPU, capture the graph of every row bucket and span at load
            (about a second each at full size), so none is captured while serving,
            where another thread's device work can spoil a capture and leave that shape
            eager.
    """

    static_cache: bool | None = Field(None, strict=True)
    max_context: int = Field(4096, ge=2)
    warm_graphs: bool = Field(True, strict=True)

    def graphs_on(self, device: torch.device) -> bool:
        """Whether steps replay from CUDA graphs on ``device``: on a GPU, unless
        ``static_cache`` is False."""
        return device.type == "cuda" and self.static_cache is not False


class PrefillGraphArgs(StaticDecodeArgs):
    """:class:`StaticDecodeArgs` with fresh prefill graphs: a session's chunks from the
    start of its slot (a conversation's first prompt, what follows it in the same step)
    replay a CUDA graph per length bucket, where steps replay graphs.

    Attributes:
        prefill_graphs: replay them (a graph per ``prefill_bucket`` positions up to
            ``max_context``, captured at load with ``warm_graphs``); the engine's step
            loop then keeps such a prompt whole rather than split it by what is left of
            a step's budget (``whole_fresh_prefills``). A forward at full size is bound
            by its launches (about half of the thinker's 90 ms for 2500 positions on one
            H200 is kernels), which a replay does not pay.
        prefill_bucket: those buckets' step in positions.
        prefill_batch: the most such prompts of one bucket that share a forward, as a
            graph per count (where that many fit a step's ``max_tokens_per_step``): a
            MoE layer's experts read their weights once for all of them (at full size,
            a 2500-position prompt gives each of 128 experts about 156 rows, where the
            experts' matmuls are bound by reading the weights).
    """

    prefill_graphs: bool = Field(True, strict=True)
    prefill_bucket: int = Field(256, ge=1)
    prefill_batch: int = Field(4, ge=1)

    def prefill_graphs_on(self, device: torch.device) -> bool:
        """Whether fresh prefills replay graphs on ``device``: with ``prefill_graphs``,
        where steps replay graphs (:meth:`graphs_on`)."""
        return self.prefill_graphs and self.graphs_on(device)


@dataclass(frozen=True, slots=True)
class StaticPlan:
    """How a model's slot cache is built (``bench decode``'s plan)."""

    slots: int
    max_len: int
    graphs: bool
    warm: bool = False
    """Capture every graph when the model is built."""

    @staticmethod
    def of(args: StaticDecodeArgs, device: torch.device, slots: int) -> StaticPlan | None:
        """The plan ``args`` ask for on ``device``, for steps of at most ``slots``."""
        enabled = device.type == "cuda" if args.static_cache is None else args.static_cache
        if not enabled:
            return None
        graphs = args.graphs_on(device)
        return StaticPlan(slots, args.max_context, graphs=graphs, warm=graphs and args.warm_graphs)


class StepCache:
    """What the model's attention layers see as their cache during one static step.

    ``update`` writes each row's new key and value at that row's position of the slot
    cache and returns the first ``span`` positions of the bucket's rows; ``mask`` hides
    every position after each row's own.
    """

    def __init__(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        positions: torch.Tensor,
        span: int,
    ) -> None:
        batch = positions.shape[0]
        self._keys = [k[:batch] for k in keys]
        self._values = [v[:batch] for v in values]
        self._rows = torch.arange(batch, device=positions.device)
        self._positions = positions
        self._span = span
        seen = torch.arange(span, device=positions.device)[None] <= positions[:, None]
        self.mask = seen[:, None, None, :]
        """[B, 1, 1, span] bool: True where a row may attend."""

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the step's key and value [B, heads, 1, dim]; the span to attend."""
        keys, values = self._keys[layer_idx], self._values[layer_idx]
        keys[self._rows, :, self._positions] = key[:, :, 0].to(keys.dtype)
        values[self._rows, :, self._positions] = value[:, :, 0].to(values.dtype)
        return keys[:, :, : self._span], values[:, :, : self._span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The span (transformers asks when it derives positions; the step passes them)."""
        return self._span

    def layer(self, index: int) -> StepCache:
        """Layer ``index``'s part alone, the cache of that layer called by itself: it
        ignores the layer index transformers passes, so a compiled decoder layer reads
        no index and one compiled graph serves every layer (:mod:`.frame_compile`)."""
        return _LayerPart(self, index)


class _LayerPart(StepCache):
    """One layer of a :class:`StepCache` (:meth:`StepCache.layer`)."""

    def __init__(self, whole: StepCache, index: int) -> None:
        self._keys, self._values = [whole._keys[index]], [whole._values[index]]
        self._rows, self._positions, self._span = whole._rows, whole._positions, whole._span
        self.mask = whole.mask

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the step's key and value in this layer's part, whatever ``layer_idx``."""
        return super().update(key, value, 0)


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """One-position attention with grouped query heads (module docstring)."""
    assert attention_mask is not None, "a static step passes its mask"
    return grouped_attention_of(query, key, value, attention_mask, scaling).transpose(1, 2), None


FUSED_MIN_BLOCKS = 64
"""The fewest (row, key head) pairs a decode step's attention runs PyTorch's fused
kernel for; below, it runs :func:`matmul_attention`.

The fused kernels (cuDNN's, flash) spread one query block of one head over one thread
block and walk its keys in order: a step of one row has as many blocks at work as the
layer has key heads (4 for the thinker, 2 for the talker on an H200's 132 SMs), each
reading 1-2 thousand keys alone. Two matrix products spread their work over the keys
instead. On two H200s (``bench decode``, 1024-position contexts), fused at every batch:
a thinker step 10.2 / 18.7 / 31.5 ms at batch 1 / 8 / 32, a talker frame 8.3 / 9.4 /
11.2 ms (benchmarks/results/qwen3_omni_random_decode_fused_h200x2.json); with the
products below this threshold: 8.1 / 17.0 / 32.5 and 7.1 / 8.6 / 11.3 ms
(``..._decode_split_h200x2.json``), and the pipeline's RTF at one session 0.138 -> 0.106.
At batch 32 the fused kernel is what made a 60 ms eager frame 11 ms. A module
attribute, read when a step is traced, so a benchmark can move it (``bench decode
--fused-min-blocks``, ``DECODE_FUSED_MIN_BLOCKS`` of benchmarks/talker_frame_profile.py).
"""


def grouped_attention_of(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """``query`` [B, heads, 1, dim] over ``key``/``value`` [B, kv_heads, span, dim] under
    ``mask`` [B, 1, 1, span], each key head's query heads grouped along the query axis
    (module docstring); [B, heads, 1, dim].

    PyTorch's own grouped-query attention (``enable_gqa``) under a mask runs its math
    kernel on CUDA: the keys and values repeated per query head and the scores in
    float32, which was most of a talker frame at batch 32 on an H200
    (benchmarks/results/qwen3_omni_random_talker_frame_profile_sdpa_h200.jsonl).
    Grouped, the masked kernels (cuDNN, memory-efficient) take it as it is; with few
    rows, :func:`matmul_attention` does (:data:`FUSED_MIN_BLOCKS`).
    """
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads * length, dim)
    if batch * kv_heads < FUSED_MIN_BLOCKS:
        out = matmul_attention(grouped, key, value, mask, scaling)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            grouped, key, value, attn_mask=mask, scale=scaling
        )
    return out.reshape(batch, heads, length, dim)


def matmul_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of ``query`` [B, kv_heads, Q, dim] over ``key``/``value`` [B, kv_heads,
    span, dim] under the boolean ``mask`` (broadcast to [B, kv_heads, Q, span]) as two
    batched matrix products, the softmax in float32 as transformers' eager attention
    computes it; [B, kv_heads, Q, dim]. Every row must see at least one key."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-2, -1)).float() * scale
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(weights, value)


AttentionInterface.register(_ATTENTION, grouped_decode_attention)


def attention_configs(model: torch.nn.Module) -> list[Any]:
    """Every distinct config among ``model``'s modules that names an attention."""
    found: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if hasattr(config, "_attn_implementation"):
            found.setdefault(id(config), config)
    return list(found.values())


@contextmanager
def grouped_attention(configs: list[Any]) -> Iterator[None]:
    """Run the attention layers of these configs through the grouped decode attention
    meanwhile.

    Only Python reads the setting, so a graph captured inside keeps the kernels it
    recorded; the model thread is the model's only user, so nothing else sees the swap.
    """
    saved = [c._attn_implementation for c in configs]
    for config in configs:
        config._attn_implementation = _ATTENTION
    try:
        yield
    finally:
        for config, was in zip(configs, saved, strict=True):
            config._attn_implementation = was
