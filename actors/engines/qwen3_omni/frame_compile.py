"""``torch.compile`` for the talker's frame step, before its CUDA graphs are captured.

A frame replayed from a graph is still bound by how many kernels it runs: at full size
on one H200 the backbone step took 5.3 ms and the code predictor's 15 steps 12.8 ms at
batch 1, thousands of small kernels. Inductor fuses the norms, rotary embeddings,
activations and cache writes around each layer's matmuls (there, 18.6 -> 9.9 ms a frame
at batch 1, 22.0 -> 13.5 ms at batch 32). Compiling the whole frame as one graph took
about two minutes per batch size (the predictor's steps unrolled, each of another
shape), so the regions compiled here are small and shape-stable:

- each backbone decoder layer by itself (:class:`CompiledLayers`): the layers share
  their code, and each is called with its own part of the slot cache
  (:meth:`~.static_decode.StepCache.layer`), so no layer index reaches the graph and one
  compiled graph serves every layer. The thinker's decode step compiles its layers the
  same way (:class:`ThinkerCompileArgs`): a decode step of one row per session is as
  launch-bound, 48 MoE layers at full size; so may its prefill forwards, over one graph
  of dynamic sizes (``CompiledLayers(prefill=True)``, below);
- one code-predictor step (:class:`CompiledCodePredictor`): the predictor writes its keys
  and values into a buffer of one position per codebook group and attends through a
  mask, one position per step, so every step has the same shapes and one compiled graph
  serves all of them. It gives ``stepping.code_predictor_frame``'s codes (the same sums,
  one position at a time). Its step is 16 small forwards of 5 layers each, so its matmuls
  are launch-bound; :class:`FusedPredictor` (``FrameCompile.fused``, on by default) runs
  each layer's query, key and value projections as one matmul and its gate and up
  projections as one (weights concatenated once, 0.15 GB at full size): 240 fewer kernels
  a frame, and on one H200 at full size (1024-token contexts,
  ``benchmarks/talker_frame_profile.py``) 9.4 -> 7.7 ms a frame at batch 1, 10.2 -> 9.4 ms
  at batch 8.

Sizes that change are made dynamic as they change (torch.compile's automatic dynamic
shapes): batch 1 compiles once, a second batch size once more for every later one, the
backbone's attention span likewise. A load that captures every (batch bucket, span) so
compiles each region two or three times (about 55 s at full size), not once per graph.
Graphs are then captured as before, each checked against the compiled step run without a
graph (:class:`~.graphs.ShapeGraphs`).

A compile that fails (or a compiled step that raises outside a capture) logs one line and
that region runs uncompiled from then on: the layers as transformers runs them, the code
predictor as ``stepping.code_predictor_frame``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import torch
from pydantic import BaseModel, Field

from omni_actors.actors.engines.qwen3_omni import stepping
from omni_actors.actors.engines.qwen3_omni.slot_cache import Segment, SlotCache, SlotStep
from omni_actors.actors.engines.qwen3_omni.static_decode import (
    StepCache,
    attention_configs,
    grouped_attention,
    grouped_decode_attention,
)

__all__ = [
    "CompileState",
    "CompiledCodePredictor",
    "CompiledLayers",
    "FrameCompile",
    "FrameCompileArgs",
    "PrefillCompileArgs",
    "ThinkerCompileArgs",
    "compile_status",
    "prefill_forward",
    "warm_prefill",
]

log = logging.getLogger(__name__)

Backend = str | Callable[..., Any]
"""A ``torch.compile`` backend: a name (``inductor``, ``aot_eager``) or a callable."""


class PrefillCompileArgs(BaseModel):
    """The arguments of an engine whose prefill forwards may be compiled.

    Attributes:
        compile_prefill: ``torch.compile`` the decoder layers of prefill forwards over
            the slot cache, for any length and any segments (one graph with dynamic
            sizes, compiled at load; the chunks' attention runs as one opaque op); None:
            on a GPU only (at full size on two H200s it took the first token 25-30%
            earlier, docs/benchmarks.md).
        compile_backend: the ``torch.compile`` backend (``inductor``; ``aot_eager``
            needs no compiler, to check that a model traces).
    """

    compile_prefill: bool | None = Field(None, strict=True)
    compile_backend: str = Field("inductor", min_length=1)

    def prefill_compile(self, device: torch.device) -> Backend | None:
        """The backend prefill forwards' layers compile with on ``device`` (None: none)."""
        enabled = device.type == "cuda" if self.compile_prefill is None else self.compile_prefill
        return self.compile_backend if enabled else None


class FrameCompileArgs(PrefillCompileArgs):
    """The arguments of an engine whose static frame step may be compiled.

    Attributes:
        compile_frame: ``torch.compile`` the frame step over the static slot cache (its
            backbone layers and code-predictor step) before its graphs are captured;
            None: on a GPU only. Frames stepped another way are not compiled.
    """

    compile_frame: bool | None = Field(None, strict=True)

    def frame_compile(self, device: torch.device) -> FrameCompile | None:
        """What these arguments compile on ``device`` (None: nothing)."""
        enabled = device.type == "cuda" if self.compile_frame is None else self.compile_frame
        return FrameCompile(self.compile_backend) if enabled else None


class ThinkerCompileArgs(PrefillCompileArgs):
    """The arguments of a thinker whose forwards may be compiled.

    Attributes:
        compile_decode: ``torch.compile`` each decoder layer of the decode step over the
            slot cache (:class:`CompiledLayers`, one compiled graph for every layer)
            before its graphs are captured; None: on a GPU only.
    """

    compile_decode: bool | None = Field(None, strict=True)

    def decode_compile(self, device: torch.device) -> Backend | None:
        """The backend the decode step's layers compile with on ``device`` (None: none)."""
        enabled = device.type == "cuda" if self.compile_decode is None else self.compile_decode
        return self.compile_backend if enabled else None


@dataclass(frozen=True, slots=True)
class FrameCompile:
    """Which regions of the frame step are compiled, with which backend."""

    backend: Backend = "inductor"
    backbone: bool = True
    """The backbone's decoder layers (:class:`CompiledLayers`)."""
    predictor: bool = True
    """The code predictor's step (:class:`CompiledCodePredictor`)."""
    fused: bool = True
    """The code predictor's projections fused (:class:`FusedPredictor`)."""


class CompileState:
    """Whether a compiled region still runs compiled; one log line when it stops.

    Args:
        name: the region, for the log line.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.failed: str | None = None
        """Why the region runs uncompiled (None: it runs compiled)."""

    def fall_back(self, error: Exception) -> None:
        """After ``error`` from the compiled region: run it uncompiled from now on.

        Raises:
            Exception: ``error`` itself where running uncompiled would not help: the
                device is out of memory, or a graph capture is under way (the capture
                fails, and :class:`~.graphs.ShapeGraphs` leaves that shape eager).
        """
        if isinstance(error, torch.OutOfMemoryError) or _capturing():
            raise error
        self.failed = _reason(error)
        log.warning("%s: torch.compile failed (%s); runs uncompiled", self.name, self.failed)


def compile_status(region: CompiledLayers | CompiledCodePredictor | None) -> str:
    """A compiled region's state: ``compiled``, ``off`` (no region), or why it runs
    uncompiled after its compile failed."""
    if region is None:
        return "off"
    failed = region.state.failed
    return "compiled" if failed is None else f"failed: {failed}"


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _reason(error: BaseException, depth: int = 3) -> str:
    """The error's type, then its cause's where it wraps one (dynamo wraps a backend's
    error), down to the innermost's first line."""
    inner = getattr(error, "inner_exception", None) or error.__cause__
    if isinstance(inner, BaseException) and inner is not error and depth > 1:
        return f"{type(error).__name__}: {_reason(inner, depth - 1)}"
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".strip()


RECOMPILE_LIMIT: Final = 64
"""How many graphs one compiled region may compile. Each (row bucket, span) key of the
frame can ask for its own before dynamo's automatic dynamic shapes generalise it (the
span, the batch, whether a span is the whole slot); dynamo's default of 8 per region ran
the later keys' layers uncompiled, inside their captured graphs, with one warning."""


def end_compile_workers() -> None:
    """End the compile workers inductor started in this process, if it started any.

    Inductor compiles in a pool of subprocesses that it starts on its first compile and
    otherwise keeps for the life of the process: in a stage that runs in the server's
    own process (or a program's), they would outlive the engine that made them. The
    engine that compiled ends them when it stops; a later compile starts a new pool.
    """
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        async_compile.shutdown_compile_workers()


def _compile(
    fn: Callable[..., Any], backend: Backend, *, dynamic: bool | None = None
) -> Callable[..., Any]:
    """``torch.compile(fn)``: called under :func:`_settings`."""
    return torch.compile(fn, backend=backend, dynamic=dynamic)


@contextmanager
def _settings(dynamic: bool) -> Iterator[None]:
    """Meanwhile, what dynamo reads when a call misses its graphs: a region may compile
    :data:`RECOMPILE_LIMIT` graphs; a ``dynamic`` one gives each size its own symbol
    (duck sizing would make sizes equal at the first call, a prompt's length and its
    step's, equal for good). Entered once per forward or frame, not per call: each
    patch costs tens of microseconds of host time."""
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        if dynamic:
            shapes: Any = torch.fx.experimental._config  # ``patch`` is made at import
            with shapes.patch(use_duck_shape=False):
                yield
        else:
            yield


def _layer_forward(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A decoder layer's own forward (what :class:`CompiledLayers` compiles)."""
    return type(layer).forward(layer, *args, **kwargs)


def _prefill_layer_forward(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The same forward for prefill steps: another function, so that dynamo keeps its
    graphs apart from the decode step's (whose shapes are guarded and captured)."""
    return type(layer).forward(layer, *args, **kwargs)


class CompiledLayers:
    """Decoder layers that run compiled while :meth:`active`, when called with a
    :class:`~.static_decode.StepCache` or a :class:`~.slot_cache.SlotStep`; see the module
    docstring.

    Args:
        layers: the model's decoder layers, in order (a layer's index in its cache).
        backend: the ``torch.compile`` backend.
        name: the region, for the log.
        prefill: for prefill forwards over a :class:`~.slot_cache.SlotStep` of chunks:
            every size dynamic from the first compile, the step's segment count left
            unbacked (one alone or many), so one graph serves every length and layout.
    """

    def __init__(
        self,
        layers: Iterable[torch.nn.Module],
        backend: Backend,
        name: str = "talker layers",
        *,
        prefill: bool = False,
    ) -> None:
        self._layers = list(layers)
        self._index = {id(layer): index for index, layer in enumerate(self._layers)}
        self._prefill = prefill
        if prefill:
            self._compiled = _compile(_prefill_layer_forward, backend, dynamic=True)
        else:
            self._compiled = _compile(_layer_forward, backend)
        self.state = CompileState(name)

    @contextmanager
    def active(self) -> Iterator[None]:
        """Meanwhile, a call of a layer runs its compiled forward.

        Swaps each layer's ``forward`` (an instance attribute, which ``nn.Module``
        calls in place of the class's); only Python reads it, so a graph captured
        meanwhile keeps the kernels it recorded, and the model thread is the layers'
        only user, so nothing else sees the swap (prefills keep transformers' forward).
        """
        if self.state.failed is not None:
            yield
            return
        for layer in self._layers:
            vars(layer)["forward"] = functools.partial(self._forward, layer)
        try:
            with _settings(self._prefill):
                yield
        finally:
            for layer in self._layers:
                vars(layer).pop("forward", None)

    def _forward(
        self, layer: torch.nn.Module, *args: Any, past_key_values: Any = None, **kwargs: Any
    ) -> Any:
        if self.state.failed is None and isinstance(past_key_values, (StepCache, SlotStep)):
            part = past_key_values.layer(self._index[id(layer)])
            mask = kwargs.get("attention_mask")
            if self._prefill and mask is not None:
                # Segments per step: any count, one alone included (only the chunks'
                # attention reads it, opaque to the graph).
                torch._dynamo.decorators.mark_unbacked(mask, 0)
            try:
                return self._compiled(layer, *args, past_key_values=part, **kwargs)
            except Exception as error:
                self.state.fall_back(error)
        return _layer_forward(layer, *args, past_key_values=past_key_values, **kwargs)


def prefill_forward(
    model: torch.nn.Module,
    step: SlotStep,
    configs: list[Any],
    embeds: torch.Tensor,
    layers: CompiledLayers | None,
) -> torch.Tensor:
    """A text model's forward over a step with prefill chunks, inputs ``embeds`` [T, H] in
    token order, its layers compiled by ``layers`` (a prefill :class:`CompiledLayers`)
    where given: the last hidden states [1, T, H]."""
    # Not a step of single positions (only where graphs are off): its attention is the
    # decode step's, another graph, for a step that costs little.
    layers = None if step.decode_only else layers
    compiled = layers.active() if layers is not None else contextlib.nullcontext()
    with step.active(configs), compiled:
        out = model(
            # A tensor of its own, not a view: a compiled layer guards on its input's
            # base, and the first layer would compile apart from the others.
            inputs_embeds=embeds.unsqueeze(0).clone() if layers is not None else embeds[None],
            position_ids=step.positions[None],
            attention_mask=step.mask,
            past_key_values=step,
            use_cache=True,
        )
    last: torch.Tensor = out.last_hidden_state
    return last


@torch.no_grad()
def warm_prefill(
    model: torch.nn.Module,
    cache: SlotCache,
    configs: list[Any],
    row: torch.Tensor,
    layers: CompiledLayers,
) -> None:
    """Compile ``layers`` now (at load, not in a first prompt's time): one forward of two
    segments at the scratch slot, inputs ``row`` [1, H] repeated, compiles the graph
    every later prefill runs."""
    segments = [Segment(cache.scratch, 0, 2), Segment(cache.scratch, 2, 3)]
    prefill_forward(model, cache.step(segments), configs, row.expand(5, -1), layers)


def _predictor_step(
    model: torch.nn.Module,
    head: torch.nn.Module,
    table: torch.nn.Module,
    inputs: torch.Tensor,
    positions: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One code-predictor position per row: ``inputs`` [B, 1, H] at ``positions`` [B],
    its keys and values written into ``keys``/``values`` [B, kv_heads, groups, dim].

    Returns:
        the code ``head`` picks [B, 1], its embedding in ``table`` [B, 1, H], and the
        next positions.
    """
    cache = StepCache(keys, values, positions, keys[0].shape[2])
    hidden = model(
        inputs_embeds=inputs,
        attention_mask=cache.mask,
        position_ids=positions[:, None],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    code = stepping.greedy(head(hidden[:, -1]))
    return code, table(code), positions + 1


class FusedPredictor(torch.nn.Module):
    """The code predictor's step with each layer's query/key/value projections as one
    matmul and its gate/up projections as one (their weights concatenated here); the
    rest is the predictor's own modules. Only for its layers as transformers builds them
    for Qwen3-Omni: projections without bias, one attention kind.

    Raises:
        ValueError: the predictor's layers are not of that shape.
    """

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self._rope = sys.modules[type(model.layers[0].self_attn).__module__].apply_rotary_pos_emb
        for index, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            projections = (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)
            if any(p.bias is not None for p in projections) or attn.sliding_window is not None:
                raise ValueError("the code predictor's layers are not Qwen3-Omni's")
            qkv = torch.cat([p.weight for p in projections[:3]])
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            self.register_buffer(f"qkv{index}", qkv, persistent=False)
            self.register_buffer(f"gate_up{index}", gate_up, persistent=False)

    def forward(
        self,
        head: torch.nn.Module,
        table: torch.nn.Module,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As :func:`_predictor_step` (the model is this module's)."""
        model = self.model
        cache = StepCache(keys, values, positions, keys[0].shape[2])
        cos, sin = model.rotary_emb(inputs, positions[:, None])
        hidden = inputs
        for index, layer in enumerate(model.layers):
            hidden = self._layer(index, layer, hidden, cos, sin, cache.layer(index))
        hidden = model.norm(hidden)
        code = stepping.greedy(head(hidden[:, -1]))
        return code, table(code), positions + 1

    def _layer(
        self,
        index: int,
        layer: Any,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StepCache,
    ) -> torch.Tensor:
        """The decoder layer's forward (transformers' sums, in its order), its
        projections fused."""
        attn, mlp = layer.self_attn, layer.mlp
        batch, dim = hidden.shape[0], int(attn.head_dim)
        linear = torch.nn.functional.linear
        qkv = linear(layer.input_layernorm(hidden), getattr(self, f"qkv{index}"))
        sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        query, key, value = torch.split(qkv, sizes, dim=-1)
        query = attn.q_norm(query.view(batch, 1, -1, dim)).transpose(1, 2)
        key = attn.k_norm(key.view(batch, 1, -1, dim)).transpose(1, 2)
        value = value.view(batch, 1, -1, dim).transpose(1, 2)
        query, key = self._rope(query, key, cos, sin)
        key, value = cache.update(key, value, 0)
        heads, _ = grouped_decode_attention(attn, query, key, value, cache.mask, attn.scaling)
        hidden = hidden + attn.o_proj(heads.reshape(batch, 1, -1))
        gate_up = linear(layer.post_attention_layernorm(hidden), getattr(self, f"gate_up{index}"))
        gate, up = gate_up.chunk(2, dim=-1)
        out: torch.Tensor = hidden + mlp.down_proj(mlp.act_fn(gate) * up)
        return out


class CompiledCodePredictor:
    """``stepping.code_predictor_frame(talker, hidden, code0)`` (greedy), its steps
    compiled; see the module docstring.

    Args:
        talker: the HF talker.
        backend: the ``torch.compile`` backend.
        fused: fuse the step's projections (:class:`FusedPredictor`) where the
            predictor's layers allow it.
    """

    def __init__(self, talker: Any, backend: Backend, *, fused: bool = False) -> None:
        self._talker = talker
        self._predictor = talker.code_predictor
        self._configs = attention_configs(self._predictor.model)
        self.state = CompileState("talker code predictor")
        step: Callable[..., Any] = functools.partial(_predictor_step, self._predictor.model)
        if fused:
            try:
                step = FusedPredictor(self._predictor.model)
            except ValueError as error:
                log.warning("%s: %s; its projections stay apart", self.state.name, error)
        self._step = step
        """A step, uncompiled: ``(head, table, inputs, positions, keys, values)``."""
        self._compiled = _compile(step, backend)

    def __call__(
        self, hidden: torch.Tensor, code0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes [B, groups], carry [B, 1, Ht])`` for ``hidden`` [B, 1, Ht] and
        ``code0`` [B, 1]."""
        if self.state.failed is None:
            try:
                with _settings(False):
                    return self.frame(hidden, code0, self._compiled)
            except Exception as error:
                self.state.fall_back(error)
        return stepping.code_predictor_frame(self._talker, hidden, code0)

    def frame(
        self, hidden: torch.Tensor, code0: torch.Tensor, step: Callable[..., Any] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The frame with each step run by ``step`` (default: uncompiled)."""
        if step is None:  # not ``or``: a compiled module has no truth value
            step = self._step
        predictor = self._predictor
        config = predictor.config
        groups = int(self._talker.config.num_code_groups)
        dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        shape = (hidden.shape[0], int(config.num_key_value_heads), groups, dim)
        layers = int(config.num_hidden_layers)
        keys = [hidden.new_zeros(shape) for _ in range(layers)]
        values = [hidden.new_zeros(shape) for _ in range(layers)]
        positions = torch.zeros(hidden.shape[0], dtype=torch.long, device=hidden.device)
        embed = self._talker.model.codec_embedding(code0)
        codes, embeds = [code0], [embed]
        heads, tables = predictor.lm_head, predictor.model.codec_embedding
        with grouped_attention(self._configs):
            # Position 0 holds the talker's hidden state: what the step picks there is
            # no code (the same head and table as the next step, so one graph serves).
            _, _, positions = step(heads[0], tables[0], hidden, positions, keys, values)
            for group in range(1, groups):
                code, embed, positions = step(
                    heads[group - 1], tables[group - 1], embed, positions, keys, values
                )
                codes.append(code)
                embeds.append(embed)
        return torch.cat(codes, dim=1), torch.cat(embeds, dim=1).sum(dim=1, keepdim=True)
