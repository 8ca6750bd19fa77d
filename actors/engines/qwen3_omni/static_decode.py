"""Decode steps of several sessions over one static KV cache, replayed from CUDA graphs.

Each session keeps its own ``DynamicCache`` for everything that is not a one-position
step (prefills, crops, rollbacks: :mod:`.stepping`). For its decode steps it leases a
*slot*: one row of a cache allocated once per engine, ``[slots, kv_heads, max_len + 1,
head_dim]`` per layer. A lease copies the session's cache into its row, steps there, and
is *settled* when something else is about to touch the session's cache: the positions
decoded in the slot are appended to the ``DynamicCache`` and the slot is free again.

Why: at full size a decode step is bound by kernel launches (70 ms eager for the 30B
thinker, 13 ms replayed from a graph), and a graph needs tensors that stay where they
were when it was captured. A step of ``B`` sessions runs rows ``0 .. bucket(B) - 1`` of
the slot cache: each row writes its new key and value at its own position (an indexed
write, no host sync) and attends its own positions ``0 .. position`` through a mask
computed in the step from the positions tensor. So the captured step depends only on
the batch bucket and on how far attention reads (a *span* bucket), and each pair is
captured once, checked against the same step run eagerly on the same inputs (bit for
bit, else that pair stays eager:
:class:`~omni_actors.actors.engines.qwen3_omni.graphs.ShapeGraphs`, as for the code
predictor and code2wav). :meth:`StaticDecoder.warm` captures every pair at load; without
it a pair is captured on the first step that needs it, where another thread's work on
the device can spoil the capture (the pair then stays eager).

Rows of the bucket that no stepping session occupies compute on whatever they hold and
are thrown away; a row a session leases but does not step this time writes at its next
position, which nothing reads before its own next step overwrites it. Sessions are kept
in the low rows (a stepping session above the bucket is moved down, evicting an idle
lease if it must), so a batch that shrinks replays a smaller graph.

Attention in the step groups each key/value head's query heads along the query axis:
one decode position per row means every query head of a group reads the same keys under
the same mask, so no key or value is repeated per query head (transformers' masked SDPA
path would copy the cache eight times per layer at the thinker's sizes).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import torch
from pydantic import BaseModel, Field

from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs
from omni_actors.actors.engines.qwen3_omni.hf import (
    AttentionInterface,
    DynamicCache,
    PreTrainedConfig,
    PreTrainedModel,
)

__all__ = [
    "SPAN_FLOOR",
    "StaticDecodeArgs",
    "StaticDecoder",
    "StaticPlan",
    "StepCache",
    "StepFn",
    "attention_configs",
    "batch_bucket",
    "grouped_attention",
    "grouped_decode_attention",
    "span_bucket",
]

log = logging.getLogger(__name__)

SPAN_FLOOR: Final = 256
"""The shortest span a step attends over (spans double from here up to ``max_len``)."""

_ATTENTION: Final = "omni-actors-static-decode"


class StaticDecodeArgs(BaseModel):
    """The arguments of an engine that may decode over a static cache.

    Attributes:
        static_cache: step decodes over a static slot cache (module docstring), replayed
            from CUDA graphs on a GPU; None: on a GPU only. Off, every step runs eagerly
            over the sessions' own caches, exactly as transformers computes one session.
        max_context: the most positions a session may hold in its slot; a session
            longer than that steps eagerly over its own cache (correct, not fast). The
            slot cache takes ``max_batch * (max_context + 1)`` positions of every layer.
        warm_graphs: on a GPU, capture the graph of every batch bucket and span at
            load (about a second each at full size: 25 with the defaults), so none is
            captured while serving, where another thread's device work can spoil a
            capture and leave that shape eager.
    """

    static_cache: bool | None = Field(None, strict=True)
    max_context: int = Field(4096, ge=2)
    warm_graphs: bool = Field(True, strict=True)


@dataclass(frozen=True, slots=True)
class StaticPlan:
    """How a model's :class:`StaticDecoder` is built (None: the model has none)."""

    slots: int
    max_len: int
    graphs: bool
    warm: bool = False
    """Capture every graph when the decoder is built (:meth:`StaticDecoder.warm`)."""

    @staticmethod
    def of(args: StaticDecodeArgs, device: torch.device, slots: int) -> StaticPlan | None:
        """The plan ``args`` ask for on ``device``, for steps of at most ``slots``."""
        enabled = device.type == "cuda" if args.static_cache is None else args.static_cache
        if not enabled:
            return None
        graphs = device.type == "cuda"
        return StaticPlan(slots, args.max_context, graphs=graphs, warm=graphs and args.warm_graphs)


def batch_bucket(batch: int, slots: int) -> int:
    """The graph batch size for ``batch`` stepping sessions: the next power of two,
    capped at ``slots``."""
    if not 1 <= batch <= slots:
        raise ValueError(f"a step needs 1..{slots} sessions, got {batch}")
    bucket = 1
    while bucket < batch:
        bucket *= 2
    return min(bucket, slots)


def span_bucket(needed: int, max_len: int) -> int:
    """How many cache positions a step attends over when its longest row needs
    ``needed``: a power of two from :data:`SPAN_FLOOR`, capped at ``max_len``."""
    if not 1 <= needed <= max_len:
        raise ValueError(f"a step attends 1..{max_len} positions, got {needed}")
    span = SPAN_FLOOR
    while span < needed:
        span *= 2
    return min(span, max_len)


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
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads * length, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(batch, heads, length, dim).transpose(1, 2), None


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


StepFn = Callable[..., tuple[torch.Tensor, ...]]
"""``step(cache: StepCache, positions [B], *inputs [B, ...]) -> outputs [B, ...]``."""


@dataclass
class _Lease:
    """A session's slot: ``length`` positions valid there, the first ``synced`` of them
    also in its ``DynamicCache``."""

    slot: int
    length: int
    synced: int
    used: int
    """The step counter when it last stepped (the least recent is evicted first)."""


class StaticDecoder:
    """Leases slots of one static cache to sessions and runs their decode steps there.

    Call every method from the model thread.

    Args:
        model: the module whose attention layers read the cache (its configs switch to
            the grouped decode attention while a step runs; only those: a model the
            step also runs, such as the talker's code predictor, keeps its own).
        config: the text config (layer count, key/value heads, head dim).
        step: the step function (:data:`StepFn`).
        slots: the most sessions one step runs (and leases at once).
        max_len: the most positions a session may have in its slot; longer sessions
            must step another way (:meth:`fits`).
        graphs: replay captured steps (CUDA only).
        name: for log lines.
        capture: how a graph is captured (:class:`.graphs.ShapeGraphs`; tests pass a
            fake one to check what :meth:`warm` captures on a machine without a GPU).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        config: PreTrainedConfig,
        step: StepFn,
        *,
        slots: int,
        max_len: int,
        device: torch.device,
        dtype: torch.dtype,
        graphs: bool,
        name: str,
        capture: Capture | None = None,
    ) -> None:
        if slots < 1 or max_len < 2:
            raise ValueError(f"need slots >= 1 and max_len >= 2, got {slots}, {max_len}")
        if graphs and device.type != "cuda" and capture is None:
            raise ValueError(f"graphs need a CUDA device, not {device}")
        self._configs = attention_configs(model)
        self._step, self._name = step, name
        self.slots, self.max_len, self.device = slots, max_len, device
        layers = int(config.num_hidden_layers)
        heads = int(config.num_key_value_heads)
        dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        # One column past max_len: a leased row that is not stepping writes at its next
        # position, which may be max_len.
        shape = (slots, heads, max_len + 1, dim)
        self._keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self._values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self._leases: dict[int, tuple[DynamicCache, _Lease]] = {}  # by id of the cache
        self._graphs: ShapeGraphs[tuple[int, int]] | None = (
            ShapeGraphs(f"{name} step", capture=capture) if graphs else None
        )
        self._inputs: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._clock = 0
        self.steps = 0
        """Steps run here."""
        self.evictions = 0
        """Idle leases settled to free a slot for a stepping session."""
        self.fallbacks = 0
        """Times sessions did not fit (:meth:`fits` said no: too long or too many)."""

    @property
    def cache_bytes(self) -> int:
        """Device memory the slot cache holds."""
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values))

    @property
    def graphed(self) -> list[tuple[int, int]]:
        """(batch bucket, span) pairs replayed from a graph."""
        return sorted(self._graphs.graphed) if self._graphs is not None else []

    @property
    def capture_s(self) -> dict[tuple[int, int], float]:
        """Seconds each (batch bucket, span) took to capture and check."""
        return dict(self._graphs.capture_s) if self._graphs is not None else {}

    def keys(self) -> list[tuple[int, int]]:
        """Every (batch bucket, span) a step may need, smallest first."""
        buckets = sorted({batch_bucket(n, self.slots) for n in range(1, self.slots + 1)})
        spans = sorted({span_bucket(n, self.max_len) for n in range(1, self.max_len + 1)})
        return [(bucket, span) for bucket in buckets for span in spans]

    @torch.no_grad()
    def warm(self, rows: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[tuple[int, int]]:
        """Capture the graph of every (batch bucket, span) now, while nothing else runs
        on the device (at load): a capture later, in the middle of serving, can be
        invalidated by another thread's work on the device and then stays eager. Steps
        on zeros at position 0 of rows no session leases (call it before any step).

        Args:
            rows: the shape past the batch dimension and the dtype of each step input.

        Returns:
            the keys replayed from a graph (the others stay eager; see the log).

        Raises:
            RuntimeError: a session holds a slot already.
        """
        if self._graphs is None:
            return []
        if self._leases:
            raise RuntimeError(f"{self._name}: warm the graphs before any session steps")
        for key in self.keys():
            positions = torch.zeros(key[0], dtype=torch.long, device=self.device)
            inputs = [
                torch.zeros((key[0], *shape), dtype=dtype, device=self.device)
                for shape, dtype in rows
            ]
            # The step's own buffers from now on: a step's rows are cast into them, so
            # they always match what the graph was captured on.
            self._inputs[key] = [positions, *inputs]
            self._graphs.capture(key, functools.partial(self._eager, key), positions, *inputs)
        return self.graphed

    def leased(self, cache: DynamicCache) -> bool:
        """Whether ``cache``'s session holds a slot (its newest positions are there)."""
        return id(cache) in self._leases

    def fits(self, lengths: Sequence[int]) -> bool:
        """Whether sessions of these lengths can step here together (counted in
        :attr:`fallbacks` when not)."""
        fit = 0 < len(lengths) <= self.slots and all(0 < n < self.max_len for n in lengths)
        self.fallbacks += not fit
        return fit

    def settle(self, cache: DynamicCache) -> None:
        """Give ``cache`` the positions its session decoded in its slot; free the slot."""
        held = self._leases.pop(id(cache), None)
        if held is None:
            return
        _, lease = held
        if lease.length > lease.synced:
            span = slice(lease.synced, lease.length)
            for layer, (keys, values) in enumerate(zip(self._keys, self._values, strict=True)):
                cache.update(
                    keys[lease.slot : lease.slot + 1, :, span].clone(),
                    values[lease.slot : lease.slot + 1, :, span].clone(),
                    layer,
                )

    def drop(self, cache: DynamicCache) -> None:
        """Free ``cache``'s slot without giving back what was decoded there."""
        self._leases.pop(id(cache), None)

    @torch.no_grad()
    def run(
        self, caches: Sequence[DynamicCache], lengths: Sequence[int], inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        """One step of ``len(caches)`` sessions, session ``i`` at position ``lengths[i]``
        (the positions it has); ``inputs`` are ``[B, ...]`` rows in the same order.

        Returns:
            the step's outputs, row ``i`` for session ``i``.

        Raises:
            ValueError: the sessions do not :meth:`fits`, or one is listed twice.
        """
        if not self.fits(lengths) or len(caches) != len(lengths):
            raise ValueError(f"{self._name}: cannot step lengths {list(lengths)} here")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError(f"{self._name}: a session is listed twice in one step")
        self._clock += 1
        self.steps += 1
        bucket = batch_bucket(len(caches), self.slots)
        rows = self._place(caches, lengths, bucket)
        span = span_bucket(max(lengths) + 1, self.max_len)
        positions = [0] * bucket
        for _, lease in self._leases.values():
            if lease.slot < bucket:
                positions[lease.slot] = lease.length
        key = (bucket, span)
        static = self._static(key, inputs, bucket)
        order = torch.tensor(rows, device=self.device)
        for buffer, given in zip(static[1:], inputs, strict=True):
            buffer.index_copy_(0, order, given.to(buffer.device, buffer.dtype))
        static[0].copy_(torch.tensor(positions))
        outputs = self._replay(key, static)
        for cache, length in zip(caches, lengths, strict=True):
            self._leases[id(cache)][1].length = length + 1
        return tuple(out.index_select(0, order) for out in outputs)

    def _static(
        self, key: tuple[int, int], inputs: Sequence[torch.Tensor], bucket: int
    ) -> list[torch.Tensor]:
        static = self._inputs.get(key)
        if static is None:
            positions = torch.zeros(bucket, dtype=torch.long, device=self.device)
            rows = [
                torch.zeros((bucket, *x.shape[1:]), dtype=x.dtype, device=self.device)
                for x in inputs
            ]
            static = self._inputs[key] = [positions, *rows]
        return static

    def _eager(
        self, key: tuple[int, int], positions: torch.Tensor, *inputs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        cache = StepCache(self._keys, self._values, positions, key[1])
        with grouped_attention(self._configs):
            return self._step(cache, positions, *inputs)

    def _replay(self, key: tuple[int, int], static: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if self._graphs is None:
            return self._eager(key, *static)
        # Every run writes the same keys and values at the same positions (same inputs),
        # so the capture's warm-up and check on the real step leave the cache as one
        # step does.
        return self._graphs(key, functools.partial(self._eager, key), *static)

    def _place(
        self, caches: Sequence[DynamicCache], lengths: Sequence[int], bucket: int
    ) -> list[int]:
        """Lease every stepping session a slot below ``bucket``; their slots, in order."""
        stepping = {id(c) for c in caches}
        taken = {
            lease.slot
            for cid, (_, lease) in self._leases.items()
            if cid in stepping and lease.slot < bucket
        }
        rows: list[int] = []
        for cache, length in zip(caches, lengths, strict=True):
            held = self._leases.get(id(cache))
            if held is not None and held[1].length != length:
                # Its cache changed without a settle: the slot is stale.
                raise RuntimeError(
                    f"{self._name}: a session stepped at {length}, its slot holds {held[1].length}"
                )
            if held is not None and held[1].slot < bucket:
                lease = held[1]
            else:
                slot = self._free_slot(bucket, taken)
                taken.add(slot)
                if held is not None:  # above the bucket: move its rows down
                    lease = held[1]
                    self._copy_slot(lease.slot, slot, lease.length)
                    lease.slot = slot
                else:
                    lease = self._load(cache, slot, length)
            lease.used = self._clock
            rows.append(lease.slot)
        return rows

    def _free_slot(self, bucket: int, taken: set[int]) -> int:
        """A slot below ``bucket`` no stepping session holds, settling an idle lease on it
        if every one is held (the least recently stepped)."""
        held = {lease.slot: cid for cid, (_, lease) in self._leases.items()}
        for slot in range(bucket):
            if slot not in taken and slot not in held:
                return slot
        idle = [(self._leases[held[s]][1].used, s) for s in range(bucket) if s not in taken]
        _, slot = min(idle)
        self.evictions += 1
        self.settle(self._leases[held[slot]][0])
        return slot

    def _load(self, cache: DynamicCache, slot: int, length: int) -> _Lease:
        layers: list[Any] = list(cache.layers)
        if len(layers) != len(self._keys) or any(
            int(layer.get_seq_length()) != length for layer in layers
        ):
            raise RuntimeError(f"{self._name}: a session at {length} has a cache of another length")
        for layer, (keys, values) in zip(
            layers, zip(self._keys, self._values, strict=True), strict=True
        ):
            keys[slot, :, :length] = layer.keys[0]
            values[slot, :, :length] = layer.values[0]
        lease = _Lease(slot, length, length, self._clock)
        self._leases[id(cache)] = (cache, lease)
        return lease

    def _copy_slot(self, source: int, target: int, length: int) -> None:
        for keys, values in zip(self._keys, self._values, strict=True):
            keys[target, :, :length] = keys[source, :, :length]
            values[target, :, :length] = values[source, :, :length]
