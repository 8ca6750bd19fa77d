"""``SlotCache``: a stage's only KV cache, one slot per session, and the step over it.

The cache is allocated once at load: ``[slots + 1, kv_heads, max_len, head_dim]`` per
layer (row ``slots`` is scratch, where padding rows write). A session holds one slot
for its whole life; what the slot holds is the session's positions ``0 .. computed -
1`` (the step loop's count, :mod:`~omni_actors.actors.engines.step_loop`). Clearing,
rolling back or truncating a conversation only moves that count: the positions past it
are never read, and the next feed overwrites them. Nothing is copied per turn.

One step feeds several sessions at once, each a *segment* (a decode row of one
position, or a prefill chunk of many) at its own slot and start position. The model
sees the step's tokens flattened, ``[1, T]``, so every token-wise layer (projections,
norms, the experts) runs over all of them in one call; only attention needs the
segments, and gets them from :class:`SlotStep`, the ``past_key_values`` of the forward:

- ``update`` writes each token's key and value at (its segment's slot, its position),
  one indexed write per layer, and returns the keys and values of the segments' slots
  up to the step's span;
- the attention (registered with transformers under :data:`ATTENTION`, swapped in for
  the forward by :meth:`SlotStep.active`) lets token ``t`` of a segment starting at
  ``p`` see positions ``0 .. p + t`` of its slot.

A prefill chunk at the start of its slot (a conversation's first prompt) is a plain
causal attention over its own positions, which PyTorch runs in the flash kernel; a masked
attention there runs another kernel, 3.7x slower on an H200 for 2500 positions
(benchmarks/results/slot_attention_h200.json). Each segment of a step attends its own
slot alone: a prefill chunk beside decode rows costs what it costs by itself, not
``rows x`` its length padded to a grid (6x less attention for 7 decode rows beside a
2500-position prompt).

So a chunked prefill computes what the one-shot prefill computes (up to the float
rounding of other matmul shapes), and a decode row is exactly one more position.

A step of decode rows alone has one shape per (row bucket, span) and reads nothing from
the host: it can be replayed from a CUDA graph. Its gathered keys are a copy of the
rows' spans per layer; keeping decoding sessions in the low slots (a compaction) would
let the graph read them in place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import torch
from pydantic import BaseModel
from torch.nn.attention.bias import causal_lower_right

from omni_actors.actors.engines.qwen3_omni import slot_decode
from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs, pad_rows
from omni_actors.actors.engines.qwen3_omni.hf import AttentionInterface, PreTrainedConfig
from omni_actors.actors.engines.qwen3_omni.static_decode import grouped_attention_of

if TYPE_CHECKING:
    from omni_actors.actors.engines.step_loop import Chunk

C = TypeVar("C", bound="Chunk[Any, Any]")
Out = TypeVar("Out")

__all__ = [
    "ATTENTION",
    "DecodeAttention",
    "DecodeAttentionArgs",
    "FRESH_ATTENTION",
    "PREFILL_BUCKET",
    "FRESH_ROWS_ATTENTION",
    "FreshRowsStep",
    "FreshStep",
    "Segment",
    "SlotCache",
    "SlotStep",
    "FreshGraphs",
    "fresh_runs",
    "row_buckets",
    "span_for",
]

PREFILL_BUCKET: Final = 256
"""Fresh prefill graphs (``prefill_graphs``) are captured for every multiple of this many
positions up to the slot's length: a chunk runs as the smallest that holds it."""

DecodeAttention = Literal["gather", "triton"]
"""How single-position rows attend their slots (:class:`SlotCache`)."""


class DecodeAttentionArgs(BaseModel):
    """The arguments of an engine whose decode rows attend a :class:`SlotCache`.

    Attributes:
        decode_attention: ``gather`` copies each row's span of its slot in every layer,
            then attends the copy; ``triton`` reads the rows' keys and values in place, up
            to each row's own position (:mod:`.slot_decode`; on a GPU with Triton, else
            the gather), the default: at c=32 on two H200s it took the thinker's decode
            step from 22.6 to 17.1 ms (docs/benchmarks.md).
    """

    decode_attention: DecodeAttention = "triton"


GraphKey = tuple[int, int]
"""(row bucket, span): the shape of a step of single positions, one graph each."""

ATTENTION: Final = "omni-actors-slot-step"
FRESH_ATTENTION: Final = "omni-actors-slot-fresh"
FRESH_ROWS_ATTENTION: Final = "omni-actors-slot-fresh-rows"

_current = threading.local()


@dataclass(frozen=True, slots=True)
class Segment:
    """What one step feeds one session: ``length`` positions from ``start`` of ``slot``."""

    slot: int
    start: int
    length: int


class SlotCache:
    """The per-layer key and value tensors of every session's slot.

    Args:
        config: the text model's config (layers, key/value heads, head dim).
        slots: sessions the cache holds at once.
        max_len: the most positions one slot holds.
        decode_attention: how single-position rows attend their slots: ``gather``
            copies each row's span, then attends the copy; ``triton`` reads the rows'
            keys in place up to each row's position (:mod:`.slot_decode`), where it
            serves (else the gather).
    """

    def __init__(
        self,
        config: PreTrainedConfig,
        *,
        slots: int,
        max_len: int,
        device: torch.device,
        dtype: torch.dtype,
        decode_attention: DecodeAttention = "triton",
    ) -> None:
        if slots < 1 or max_len < 1:
            raise ValueError(f"need slots >= 1 and max_len >= 1, got {slots}, {max_len}")
        self.slots, self.max_len, self.device = slots, max_len, device
        layers = int(config.num_hidden_layers)
        heads = int(config.num_key_value_heads)
        dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        shape = (slots + 1, heads, max_len, dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.in_place = decode_attention == "triton" and slot_decode.serves(
            self.keys[0], int(config.num_attention_heads)
        )
        """Whether single-position rows attend in place (``decode_attention``)."""

    @property
    def scratch(self) -> int:
        """The row padding segments write to."""
        return self.slots

    @property
    def nbytes(self) -> int:
        """Device memory the cache holds."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @staticmethod
    def bytes_per_slot(config: PreTrainedConfig, max_len: int, dtype: torch.dtype) -> int:
        """What one slot of ``max_len`` positions costs (keys and values, every layer)."""
        heads = int(config.num_key_value_heads)
        dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        size = torch.empty((), dtype=dtype).element_size()
        return 2 * int(config.num_hidden_layers) * heads * max_len * dim * size

    def step(self, segments: Sequence[Segment], *, rows: int | None = None) -> SlotStep:
        """The ``past_key_values`` of one forward over ``segments`` (in token order),
        padded to ``rows`` segments of one position each at the scratch row.

        Raises:
            ValueError: a segment runs past ``max_len`` or is empty.
        """
        padded = list(segments)
        if rows is not None:
            padded += [Segment(self.scratch, 0, 1)] * (rows - len(padded))
        for seg in padded:
            if seg.length < 1 or seg.start < 0 or seg.start + seg.length > self.max_len:
                raise ValueError(
                    f"a segment of {seg.length} positions from {seg.start} does not fit a "
                    f"slot of {self.max_len}"
                )
        longest = max(seg.length for seg in padded)
        ends = max(seg.start + seg.length for seg in padded)
        token_row = [i for i, seg in enumerate(padded) for _ in range(seg.length)]
        token_col = [t for seg in padded for t in range(seg.length)]
        token_pos = [seg.start + t for seg in padded for t in range(seg.length)]
        device = self.device
        return SlotStep(
            self,
            slots=torch.tensor([seg.slot for seg in padded], device=device),
            starts=torch.tensor([seg.start for seg in padded], device=device),
            token_row=torch.tensor(token_row, device=device),
            token_col=torch.tensor(token_col, device=device),
            positions=torch.tensor(token_pos, device=device),
            longest=longest,
            span=span_for(ends, self.max_len),
            segments=padded,
        )

    def graph_keys(self, max_rows: int) -> list[GraphKey]:
        """Every (row bucket, span) a step of at most ``max_rows`` single positions may
        need, smallest first."""
        sizes = row_buckets(max_rows)
        rows = sorted({min(s for s in sizes if s >= n) for n in range(1, max_rows + 1)})
        spans = sorted({span_for(n, self.max_len) for n in range(1, self.max_len + 1)})
        return [(row, span) for row in rows for span in spans]

    def decode_step(self, slots: torch.Tensor, starts: torch.Tensor, span: int) -> SlotStep:
        """The ``past_key_values`` of a step of one position per row: row ``i`` at
        ``starts[i]`` of ``slots[i]`` (built from tensors only: capturable)."""
        rows = torch.arange(slots.shape[0], device=slots.device)
        return SlotStep(
            self,
            slots=slots,
            starts=starts,
            token_row=rows,
            token_col=torch.zeros_like(rows),
            positions=starts,
            longest=1,
            span=span,
            in_place=self.in_place,
        )

    def fresh_step(self, slots: torch.Tensor, length: int) -> FreshStep:
        """The ``past_key_values`` of one forward over ``length`` positions from the start
        of each slot of ``slots`` [K] (built from tensors only: capturable)."""
        if not 0 < length <= self.max_len:
            raise ValueError(
                f"a fresh chunk of {length} positions does not fit a slot of {self.max_len}"
            )
        return FreshStep(self, slots, length)

    def fresh_rows_step(
        self, slots: torch.Tensor, length: int, row_slots: torch.Tensor, row_starts: torch.Tensor
    ) -> FreshRowsStep:
        """:meth:`fresh_step` with single-position rows after the runs: row ``i`` at
        ``row_starts[i]`` of ``row_slots[i]`` (built from tensors only: capturable)."""
        if not 0 < length <= self.max_len:
            raise ValueError(
                f"a fresh chunk of {length} positions does not fit a slot of {self.max_len}"
            )
        return FreshRowsStep(self, slots, length, row_slots, row_starts)


class FreshGraphs:
    """A stage's fresh prefill graphs: ``forward(embeds [K * L, H], slots [K])`` (a
    :class:`FreshStep` over ``K`` runs of ``L`` positions, each from the start of its
    slot, returning tensors of ``K * L`` rows), replayed from a CUDA graph per (``K``,
    ``L``): ``L`` every multiple of ``bucket`` positions up to the slot's length, ``K``
    from one up to ``batch``, where ``K`` runs that long fit ``max_tokens`` (the step's
    budget). Each run is padded at its end to its bucket (with copies of its last input:
    see :class:`FreshStep` for why the padding changes nothing) and its outputs cut back.

    Runs of one bucket share a forward: the experts of a MoE layer read their weights
    once for all of them, where a forward per run reads them per run (docs/gpus.md).
    With ``rows``, every forward also takes that many single-position rows after its
    runs, ``forward(embeds [K * L + R, H], slots [K], row_slots [R], row_starts [R])`` (a
    :class:`FreshRowsStep`): a step's decode rows ride in its first fresh forward
    (padded with rows at the scratch slot), not in a forward of their own.

    Args:
        name: the graphs' name, for the log.
        cache: the slots the forward writes.
        bucket: the buckets' step in positions.
        forward: the capturable forward.
        capture: how graphs are captured (tests pass a stand-in).
        batch: the most runs one forward takes.
        max_tokens: the most positions a step feeds (None: no limit).
        rows: the most decode rows a forward takes beside its runs (0: none, they run
            as a step of their own).
    """

    def __init__(
        self,
        name: str,
        cache: SlotCache,
        bucket: int,
        forward: Callable[..., tuple[torch.Tensor, ...]],
        capture: Capture | None = None,
        *,
        batch: int = 1,
        max_tokens: int | None = None,
        rows: int = 0,
    ) -> None:
        if bucket < 1 or batch < 1:
            raise ValueError(
                f"prefill_bucket and prefill_batch must be >= 1, got {bucket}, {batch}"
            )
        if rows < 0:
            raise ValueError(f"prefill_rows must be >= 0, got {rows}")
        self.rows = rows
        """The decode rows each forward takes after its runs."""
        self.sizes = list(range(bucket, cache.max_len + 1, bucket))
        """The lengths captured, smallest first."""
        # A bucket's runs are at least ``size - bucket + 1`` positions long: as many of
        # them as the step's budget holds can come in one step.
        self._counts = {
            size: max(1, min(batch, (max_tokens or batch * size) // (size - bucket + 1)))
            for size in self.sizes
        }
        self._cache = cache
        self._bucket = bucket
        self._forward = forward
        self._graphs: ShapeGraphs[tuple[int, ...]] = ShapeGraphs(name, capture=capture)

    @property
    def keys(self) -> list[tuple[int, ...]]:
        """The (runs, length) shapes captured at :meth:`warm`, then with :attr:`rows`
        each (runs, length, rows): a step without decode rows pays for none."""
        keys: list[tuple[int, ...]] = [
            (n, size) for size in self.sizes for n in range(1, self._counts[size] + 1)
        ]
        return keys + [(*key, self.rows) for key in keys] if self.rows else keys

    @property
    def graphed(self) -> list[tuple[int, ...]]:
        """(runs, length) shapes that replay from a graph."""
        return sorted(self._graphs.graphed)

    @property
    def eager_steps(self) -> int:
        """Runs that went eager because their shape's graph failed or differed."""
        return self._graphs.eager_steps

    def warm(
        self, row: torch.Tensor, keys: Sequence[tuple[int, ...]] | None = None
    ) -> list[tuple[int, ...]]:
        """Capture every shape now (or those of ``keys``, each one of :attr:`keys`), over
        the scratch slot, on copies of ``row`` [1, H]."""
        unknown = sorted(set(keys or ()) - set(self.keys))
        if unknown:
            raise ValueError(f"no fresh prefill graph has the shapes {unknown}")
        for key in self.keys if keys is None else keys:
            count, size, *rows = key
            slots = torch.full((count,), self._cache.scratch, device=row.device)
            inputs = row.expand(count * size + sum(rows), -1).contiguous()
            extra = self._rows(slots) if rows else ()
            self._graphs.capture(key, self._forward, inputs, slots, *extra)
        return self.graphed

    def _rows(
        self, like: torch.Tensor, slots: Sequence[int] = (), starts: Sequence[int] = ()
    ) -> tuple[torch.Tensor, ...]:
        """The forward's row inputs: ``slots`` and ``starts`` padded to :attr:`rows`
        with position 0 of the scratch slot."""
        pad = self.rows - len(slots)
        given = [list(slots) + [self._cache.scratch] * pad, list(starts) + [0] * pad]
        return tuple(torch.tensor(v, device=like.device, dtype=torch.long) for v in given)

    def __call__(
        self,
        embeds: Sequence[torch.Tensor],
        slots: Sequence[int],
        rows: tuple[torch.Tensor, Sequence[int], Sequence[int]] | None = None,
    ) -> list[tuple[torch.Tensor, ...]]:
        """``forward`` over runs ``embeds`` [L_i, H] (one bucket's, at most its count),
        each from the start of its slot in ``slots``, replayed from the graph of their
        shape: each run's outputs, its first ``L_i`` rows; then, where ``rows`` gives
        decode rows (their inputs [R, H], slots and positions; at most :attr:`rows`),
        theirs."""
        lengths = [run.shape[0] for run in embeds]
        size = -(-max(lengths) // self._bucket) * self._bucket
        parts = [pad_rows(run, size) for run in embeds]
        key: tuple[int, ...] = (len(lengths), size)
        if rows is not None:
            row_embeds, row_slots, row_starts = rows
            if not 0 < len(row_slots) <= self.rows:
                raise ValueError(f"{len(row_slots)} decode rows, not 1 to {self.rows}")
            parts.append(pad_rows(row_embeds, self.rows))
            key = (*key, self.rows)
        padded = torch.cat(parts)
        given = torch.tensor(list(slots), device=padded.device)
        extra = self._rows(given, row_slots, row_starts) if rows is not None else ()
        outputs = self._graphs(key, self._forward, padded, given, *extra)
        results = [
            tuple(output[n * size : n * size + length] for output in outputs)
            for n, length in enumerate(lengths)
        ]
        if rows is not None:
            end = len(lengths) * size
            results.append(tuple(output[end : end + len(row_slots)] for output in outputs))
        return results

    def step(
        self,
        chunks: list[C],
        fresh: Callable[[list[list[C]], list[C]], list[Out]],
        rest: Callable[[list[C]], list[Out]],
    ) -> list[Out]:
        """One output per chunk of a step: the runs that start their slots
        (:func:`fresh_runs`, at most the largest bucket), those of one bucket together
        (at most its count at a time), through ``fresh`` (an output per chunk of its
        runs, in order, then one per decode row given with them: the step's decode rows
        go with its first fresh forward where :attr:`rows` holds them); the step's other
        chunks through ``rest`` as a step of their own (they read other slots: the order
        does not matter); the whole step through ``rest`` where none starts."""
        runs = fresh_runs(chunks, self.sizes[-1]) if self.sizes else []
        if not runs:
            return rest(chunks)
        by_size: dict[int, list[list[int]]] = {}
        for run in runs:
            length = sum(chunks[i].length for i in run)
            by_size.setdefault(-(-length // self._bucket) * self._bucket, []).append(run)
        in_runs = {i for run in runs for i in run}
        rows = [
            i
            for i, chunk in enumerate(chunks)
            if i not in in_runs and chunk.work.decode and chunk.length == 1
        ]
        if not 0 < len(rows) <= self.rows:
            rows = []
        outputs: dict[int, Out] = {}
        for size, same in by_size.items():
            count = self._counts[size]
            for first in range(0, len(same), count):
                group = same[first : first + count]
                flat = [i for run in group for i in run] + rows
                results = fresh(
                    [[chunks[i] for i in run] for run in group], [chunks[i] for i in rows]
                )
                outputs.update(zip(flat, results, strict=True))
                rows = []
        others = [i for i in range(len(chunks)) if i not in outputs]
        if others:
            outputs.update(zip(others, rest([chunks[i] for i in others]), strict=True))
        return [outputs[i] for i in range(len(chunks))]


def fresh_runs(chunks: Sequence[Chunk[Any, Any]], largest: int) -> list[list[int]]:
    """The indices of each request's chunks in a step that start its slot: all of its
    chunks in the step, prefills back to back from position 0, ``largest`` positions at
    most (a fresh prefill graph's length). Runs of one length bucket share a
    :class:`FreshStep`."""
    by_request: dict[int, list[int]] = {}
    for index, chunk in enumerate(chunks):
        by_request.setdefault(id(chunk.request), []).append(index)
    runs = []
    for indices in by_request.values():
        run = [chunks[i] for i in indices]
        starts = [c.start for c in run]
        ends = [c.start + c.length for c in run]
        if (
            starts[0] == 0
            and not any(c.work.decode for c in run)
            and starts[1:] == ends[:-1]
            and ends[-1] <= largest
        ):
            runs.append(indices)
    return runs


def row_buckets(largest: int) -> tuple[int, ...]:
    """The row counts a step of single positions is captured for: powers of two below
    ``largest``, and ``largest``."""
    sizes = []
    size = 1
    while size < largest:
        sizes.append(size)
        size *= 2
    return (*sizes, largest)


def span_for(needed: int, max_len: int) -> int:
    """How many positions a step attends: a power of two from 256 (few shapes to
    capture: each is a graph of a decode step), at least ``needed``, at most ``max_len``."""
    span = 256
    while span < needed:
        span *= 2
    return min(span, max_len)


class SlotStep:
    """One forward's view of the :class:`SlotCache` (module docstring).

    Attributes:
        positions: [T] each token's position in its slot (the rotary positions).
        mask: [B, 1, longest, span] bool, True where a segment's token may attend.
        segments: the segments, where the step was built from them (not a decode step).
    """

    is_compileable: Final = False
    _attention: str = ATTENTION

    def __init__(
        self,
        cache: SlotCache,
        *,
        slots: torch.Tensor,
        starts: torch.Tensor,
        token_row: torch.Tensor,
        token_col: torch.Tensor,
        positions: torch.Tensor,
        longest: int,
        span: int,
        segments: Sequence[Segment] | None = None,
        in_place: bool = False,
    ) -> None:
        self._cache = cache
        # The host's view of the segments, for a step with prefill chunks (each attends
        # by itself); a decode step is built from tensors alone and has none. Worked out
        # once here, not in each layer's attention.
        self.segments = tuple(segments) if segments is not None else None
        self.chunks: list[tuple[int, slice, int]] = []  # (slot, its tokens, start)
        self.single_rows: torch.Tensor | None = None  # segments of one position
        self.single_tokens: torch.Tensor | None = None  # and where their tokens are
        if self.segments is not None:
            rows, tokens, offset = [], [], 0
            for row, seg in enumerate(self.segments):
                if seg.length == 1:
                    rows.append(row)
                    tokens.append(offset)
                else:
                    self.chunks.append((seg.slot, slice(offset, offset + seg.length), seg.start))
                offset += seg.length
            if rows:
                self.single_rows = torch.tensor(rows, device=starts.device)
                self.single_tokens = torch.tensor(tokens, device=starts.device)
        self.slots, self.starts = slots, starts
        self.token_row, self.token_col, self.positions = token_row, token_col, positions
        self.token_slot = slots.index_select(0, token_row)
        self.longest, self.span = longest, span
        self.decode_only = longest == 1
        offsets = torch.arange(longest, device=starts.device)
        seen = starts[:, None] + offsets[None, :]  # [B, longest] each query's position
        keys = torch.arange(span, device=starts.device)
        # A tensor of its own, not a view of one: a compiled layer guards on a view's
        # base, whose sizes it cannot leave dynamic (:mod:`.frame_compile`).
        self.mask = keys[None, None, None, :] <= seen[:, None, :, None]
        self.in_place = in_place and self.decode_only
        if self.in_place:
            # Not a mask: the rows' (slot, position) pairs [B, 1, 1, 2], what the in-place
            # attention reads (transformers passes a 4D mask to the attention as it is).
            self.mask = torch.stack([slots, starts], 1)[:, None, None, :]

    @contextmanager
    def active(self, configs: Sequence[Any]) -> Iterator[None]:
        """Route the attention of ``configs``' layers through this step meanwhile (the
        model thread is the model's only user: nothing else sees the swap)."""
        saved = [config._attn_implementation for config in configs]
        for config in configs:
            config._attn_implementation = self._attention
        _current.step = self
        try:
            yield
        finally:
            _current.step = None
            for config, was in zip(configs, saved, strict=True):
                config._attn_implementation = was

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the step's keys and values [1, heads, T, dim]; the segments' slots."""
        return self._write(self._cache.keys[layer_idx], self._cache.values[layer_idx], key, value)

    def _write(
        self, keys: torch.Tensor, values: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys[self.token_slot, :, self.positions] = key[0].transpose(0, 1).to(keys.dtype)
        values[self.token_slot, :, self.positions] = value[0].transpose(0, 1).to(values.dtype)
        if not self.decode_only or self.in_place:
            # The whole layer: each prefill chunk attends a view of its own slot (no
            # gathered copy of every segment's span, and no span in a compiled graph),
            # and in-place rows their slots as they lie.
            return keys, values
        return (
            keys.index_select(0, self.slots)[:, :, : self.span],
            values.index_select(0, self.slots)[:, :, : self.span],
        )

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The span (transformers may ask; every position is passed explicitly)."""
        return self.span

    def layer(self, index: int) -> SlotStep:
        """Layer ``index``'s part alone, for that layer called by itself: it ignores the
        layer index transformers passes, so a compiled decoder layer reads no index and
        one compiled graph serves every layer (:mod:`.frame_compile`)."""
        return _SlotLayer(self, index)


class _SlotLayer(SlotStep):
    """One layer of a :class:`SlotStep` (:meth:`SlotStep.layer`)."""

    def __init__(self, whole: SlotStep, index: int) -> None:
        vars(self).update(vars(whole))
        # The layer's tensors, not its index: a compiled layer reading an index would
        # be compiled again for every layer.
        self._keys, self._values = whole._cache.keys[index], whole._cache.values[index]

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the step's keys and values in this layer, whatever ``layer_idx``."""
        return self._write(self._keys, self._values, key, value)


class FreshStep(SlotStep):
    """A forward over runs of ``length`` positions, each at the start of its own slot (a
    conversation's first prompt, and what follows it in the same step), built from
    tensors alone, so that it can be replayed from a CUDA graph per (runs, length): its
    keys and values are written to the slots as any step's are, and each run's attention
    reads the run's own (plain causal attention, :data:`FRESH_ATTENTION`, the runs as a
    batch), nothing of the slot. A run padded at its end computes what the run alone
    computes at its first positions: causal attention never lets a position see the
    padding after it, and the padding's keys land past the slot's computed length, which
    nothing reads and the next feed overwrites."""

    _attention = FRESH_ATTENTION

    def __init__(self, cache: SlotCache, slots: torch.Tensor, length: int) -> None:
        positions = torch.arange(length, device=slots.device).repeat(slots.shape[0])
        rows = torch.arange(slots.shape[0], device=slots.device).repeat_interleave(length)
        super().__init__(
            cache,
            slots=slots,
            starts=torch.zeros_like(slots),
            token_row=rows,
            token_col=positions,
            positions=positions,
            longest=length,
            span=length,
        )

    def _write(
        self, keys: torch.Tensor, values: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        super()._write(keys, values, key, value)
        return key, value

    def layer(self, index: int) -> SlotStep:
        """Layer ``index``'s part alone (:meth:`SlotStep.layer`)."""
        return _FreshLayer(self, index)


class _FreshLayer(_SlotLayer, FreshStep):
    """One layer of a :class:`FreshStep`: :class:`_SlotLayer`'s tensors, the fresh write."""


class FreshRowsStep(FreshStep):
    """A :class:`FreshStep` whose forward also runs single-position rows of other slots
    (the step's decode rows), after the runs' ``K * L`` positions: row ``i`` at
    ``row_starts[i]`` of ``row_slots[i]``, attending its slot as a decode step's row
    does, over the whole slot (the span is the slot's length: one graph serves every
    position). Built from tensors alone, so that it replays from a CUDA graph per (runs,
    length) as a :class:`FreshStep` does.

    Why one forward: a decode step beside a first prompt otherwise costs a forward of
    its own, its MoE layers reading every expert's weights again (at full size on an
    H200, 15-28 ms beside the 123 ms of three 2500-position prompts), where here the
    rows ride on the runs' reads. Every token's key and value is written first (one
    indexed write, as any step's); the attention then reads each run's own back from its
    slot, and each row its slot's span (:data:`FRESH_ROWS_ATTENTION`).
    """

    _attention = FRESH_ROWS_ATTENTION

    def __init__(
        self,
        cache: SlotCache,
        slots: torch.Tensor,
        length: int,
        row_slots: torch.Tensor,
        row_starts: torch.Tensor,
    ) -> None:
        super().__init__(cache, slots, length)
        self.runs, self.length = int(slots.shape[0]), length
        self.row_slots, self.row_starts = row_slots, row_starts
        self.span = cache.max_len
        keys = torch.arange(self.span, device=row_starts.device)
        self.row_mask = keys[None, None, None, :] <= row_starts[:, None, None, None]
        self.token_slot = torch.cat([self.token_slot, row_slots])
        self.positions = torch.cat([self.positions, row_starts])

    _write = SlotStep._write  # the whole layer: the attention reads runs and rows back

    def layer(self, index: int) -> SlotStep:
        """Layer ``index``'s part alone (:meth:`SlotStep.layer`)."""
        return _FreshRowsLayer(self, index)


class _FreshRowsLayer(_SlotLayer, FreshRowsStep):
    """One layer of a :class:`FreshRowsStep`: :class:`_SlotLayer`'s tensors, its write."""


def _fresh_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """A :class:`FreshStep`'s attention: ``query`` [1, heads, K * L, dim] of ``K`` runs
    of ``L`` positions (the mask's first size) over the runs' own ``key``/``value`` [1,
    kv_heads, K * L, dim], each run causally; [1, K * L, heads, dim]."""
    assert attention_mask is not None, "a fresh step passes its mask"
    if torch.compiler.is_compiling():
        # Opaque to a compiled prefill layer: the run count is the mask's unbacked first
        # size (:class:`~.frame_compile.CompiledLayers`), which a traced view cannot split by.
        out = torch.ops.omni_actors.slot_fresh_attention(query, key, value, attention_mask, scaling)
    else:
        out = _runs_attention(query, key, value, attention_mask, scaling)
    return out, None


@torch.library.custom_op("omni_actors::slot_fresh_attention", mutates_args=())
def _runs_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """:func:`_fresh_attention`'s runs, ``mask.shape[0]`` of them, as one batch of the
    flash kernel; [1, K * L, heads, dim]."""
    runs = mask.shape[0]
    # [1, heads, K * L, dim] -> [K, heads, L, dim]: the runs as the batch.
    query, key, value = (
        t[0].view(t.shape[1], runs, -1, t.shape[3]).transpose(0, 1) for t in (query, key, value)
    )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=scaling, enable_gqa=True
    )
    # Contiguous, as the op's declared shape is: a compiled layer reads it so.
    return out.transpose(1, 2).contiguous().view(1, -1, out.shape[1], out.shape[3])


@_runs_attention.register_fake
def _runs_attention_shape(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    return query.new_empty((1, query.shape[2], query.shape[1], query.shape[3]))


def _fresh_rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """A :class:`FreshRowsStep`'s attention: ``query`` [1, heads, K * L + R, dim];
    ``key``/``value`` the layer's whole cache, where the step's keys were just written;
    [1, K * L + R, heads, dim]."""
    flat = query[0].transpose(0, 1)  # [T, heads, dim]
    if torch.compiler.is_compiling():
        # Opaque to a compiled prefill layer, as the chunks' attention is: it reads the
        # step's runs and rows, not the layer's inputs.
        out = torch.ops.omni_actors.slot_step_attention(flat, key, value, scaling)
    else:
        out = _runs_and_rows(flat, key, value, scaling)
    return out[None], None


def _runs_and_rows(
    flat: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """The current :class:`FreshRowsStep`'s runs (one batch of the flash kernel, each
    causal over its own slot's first ``L`` positions) and rows (a decode step's
    attention): ``flat`` [T, heads, dim], ``keys``/``values`` the layer's cache; [T,
    heads, dim]."""
    step: FreshRowsStep = _current.step
    runs, length = step.runs, step.length
    size = runs * length
    heads, dim = flat.shape[1], flat.shape[2]
    query = flat[:size].reshape(runs, length, heads, dim).transpose(1, 2)
    key = keys.index_select(0, step.slots)[:, :, :length]
    value = values.index_select(0, step.slots)[:, :, :length]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=scaling, enable_gqa=True
    )
    rows = _rows_over_slots(
        flat[size:], keys, values, step.row_slots, step.row_starts, step.row_mask, scaling
    )
    return torch.cat([out.transpose(1, 2).reshape(size, heads, dim), rows])


def _slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of a :class:`SlotStep`'s segments over their slots (module docstring):
    ``query`` [1, heads, T, dim]; ``key``/``value`` the segments' spans [B, kv_heads, span,
    dim] in a step of single positions, else the layer's whole cache."""
    assert attention_mask is not None, "a slot step passes its mask"
    flat = query[0].transpose(0, 1)  # [T, heads, dim]
    if attention_mask.dtype == torch.long:
        # An in-place decode step's (slot, position) pairs, ``key``/``value`` the layer.
        slots, starts = attention_mask[:, 0, 0, 0], attention_mask[:, 0, 0, 1]
        span = key.shape[2]
        return slot_decode.attend(flat, key, value, slots, starts, scaling, span)[None], None
    if attention_mask.shape[2] == 1:
        # One position per segment: nothing read from the step but its mask, so a
        # compiled layer (and a captured graph) sees tensors only.
        return _single_positions(flat, key, value, attention_mask, scaling)[None], None
    if torch.compiler.is_compiling():
        # Opaque to a compiled prefill layer (:mod:`.frame_compile`): traced, the step's
        # host layout (each chunk's slot, tokens and start) would be constants of the
        # graph, and every new layout another compile.
        out = torch.ops.omni_actors.slot_step_attention(flat, key, value, scaling)
    else:
        out = _chunks_attention(flat, key, value, scaling)
    return out[None], None


@torch.library.custom_op("omni_actors::slot_step_attention", mutates_args=())
def _step_attention_op(
    flat: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """The current step's attention as one op of a compiled graph, read from the step at
    run time: a :class:`FreshRowsStep`'s runs and rows (:func:`_runs_and_rows`), else a
    step's chunks and the single rows beside them (:func:`_chunks_attention`)."""
    if isinstance(_current.step, FreshRowsStep):
        return _runs_and_rows(flat, keys, values, scaling)
    return _chunks_attention(flat, keys, values, scaling)


@_step_attention_op.register_fake
def _step_attention_shape(
    flat: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    return torch.empty_like(flat)


def _chunks_attention(
    flat: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """The current step's segments (prefill chunks, and single positions beside them)
    over their slots: ``flat`` [T, heads, dim], ``keys``/``values`` the layer's cache
    [slots + 1, kv_heads, max_len, dim]; [T, heads, dim]."""
    step: SlotStep = _current.step
    assert step.segments is not None, "a step with prefill chunks is built from its segments"
    out = torch.empty_like(flat)
    for slot, tokens, start in step.chunks:
        out[tokens] = _chunk(flat[tokens], keys[slot], values[slot], start, scaling)
    if step.single_rows is not None and step.single_tokens is not None:
        rows, at = step.single_rows, step.single_tokens
        slots, starts = step.slots.index_select(0, rows), step.starts.index_select(0, rows)
        mask = step.mask[rows][:, :, :1, : step.span]
        out[at] = _rows_over_slots(flat[at], keys, values, slots, starts, mask, scaling)
    return out


def _rows_over_slots(
    flat: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """Single positions [R, heads, dim] over their slots of the layer's cache
    ``keys``/``values``, row ``i`` at ``starts[i]`` of ``slots[i]`` under ``mask`` [R, 1, 1,
    span] (its span): in place where the current step's cache says so, else over a
    gathered copy of the span; [R, heads, dim]."""
    step: SlotStep = _current.step
    if step._cache.in_place:
        return slot_decode.attend(flat, keys, values, slots, starts, scaling, keys.shape[2])
    span = mask.shape[-1]
    key, value = (t.index_select(0, slots)[:, :, :span] for t in (keys, values))
    return _single_positions(flat, key, value, mask, scaling)


def _single_positions(
    flat: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """Row ``i``'s one query [heads, dim] over its slot's ``key``/``value`` [kv_heads,
    span, dim] under ``mask`` [rows, 1, 1, span]; [rows, heads, dim]."""
    return grouped_attention_of(flat[:, :, None], key, value, mask, scaling)[:, :, 0]


def _chunk(
    flat: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: int,
    scaling: float | None,
) -> torch.Tensor:
    """A prefill chunk's queries [L, heads, dim] at positions ``start ..`` over its
    slot's ``key``/``value`` [kv_heads, span, dim], causally; [L, heads, dim]."""
    length = flat.shape[0]
    end = start + length
    query, key, value = flat.transpose(0, 1)[None], key[None, :, :end], value[None, :, :end]
    # Causal from the lower right: query t sees positions 0 .. start + t. Not a mask
    # tensor: a masked grouped-query attention runs PyTorch's math kernel on CUDA (keys
    # repeated per query head, scores of every pair in float32), while this runs the
    # flash kernel, which reads the grouped heads as they are (plain causal at start 0).
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=causal_lower_right(length, end), scale=scaling, enable_gqa=True
    )
    return out[0].transpose(0, 1)


AttentionInterface.register(ATTENTION, _slot_attention)
AttentionInterface.register(FRESH_ATTENTION, _fresh_attention)
AttentionInterface.register(FRESH_ROWS_ATTENTION, _fresh_rows_attention)
