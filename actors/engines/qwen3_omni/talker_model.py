"""``TalkerModel``: the loaded talker and the one step its engine's loop runs.

Everything here runs in the engine's model thread (``TorchEngine.call``). The engine's
:class:`~omni_actors.actors.engines.step_loop.StepLoop` decides what each step feeds: a
frame row of every session whose next frame's text has come, and prefill chunks of the
sessions whose user rows (or a reply's opening: the user rows left and the 9-position
assistant prefix) are waiting. :meth:`TalkerModel.step` runs the step as one talker
forward over the :class:`~.slot_cache.SlotCache`, the talker's only KV cache, then the
codec head and the code predictor over every row that makes a frame (batched: its cache
is fresh per frame and as long for every row). A step of frames alone is one CUDA graph
per (row bucket, span) on a GPU: the talker step, its codec head, the first code and the
code predictor's loop. A step with prefill chunks whose positions fit
:data:`ROWS_PIECES` replays of the largest graph runs its backbone as one row per
position, replayed from a graph per (row bucket, span) (captured at load with the frame
graphs, else on first use); its frames' code predictor replays its own graphs. With
fresh prefill graphs, a session's chunks from the start of its slot replay the graph of
their length beside the rest of the step (:class:`~.slot_cache.FreshGraphs`).

A step of frames alone reads nothing back: it returns once queued, each row's codec EOS
flag copied to pinned host memory behind it with an event recorded after (:class:`Framed`),
so the engine can queue a session's next frame before it waits for the last one.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import torch

from omni_actors.actors.engines.qwen3_omni import layout, stepping, weights
from omni_actors.actors.engines.qwen3_omni.code_predictor_graph import (
    CodeFrame,
    GraphedCodePredictor,
)
from omni_actors.actors.engines.qwen3_omni.frame_compile import (
    Backend,
    CompiledCodePredictor,
    CompiledLayers,
    FrameCompile,
    compile_status,
    prefill_forward,
    warm_prefill,
)
from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs, bucket
from omni_actors.actors.engines.qwen3_omni.hf import (
    PreTrainedConfig,
    Qwen3OmniMoeTalkerForConditionalGeneration,
)
from omni_actors.actors.engines.qwen3_omni.moe import MoeCombine, MoeImplementation
from omni_actors.actors.engines.qwen3_omni.moe import install as moe_install
from omni_actors.actors.engines.qwen3_omni.slot_cache import (
    PREFILL_BUCKET,
    DecodeAttention,
    FreshGraphs,
    Segment,
    SlotCache,
    row_buckets,
    span_for,
)
from omni_actors.actors.engines.qwen3_omni.static_decode import attention_configs
from omni_actors.actors.engines.step_loop import Chunk, Request, StepLoop
from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.cuda import Completable
from omni_actors.errors import ModelFileError

__all__ = ["PREFIX", "Frame", "Framed", "TalkerChunk", "TalkerFeed", "TalkerModel", "Voice"]

PREFIX: Final = 9
"""Positions of the assistant prefix (``stepping.talker_assistant_prefix``)."""

Frame = tuple[torch.Tensor, torch.Tensor] | None
"""``(codes [1, G], next_input [1, 1, Ht])`` of one frame, or None at codec EOS."""


@dataclass
class Voice:
    """One session's talker state, kept across responses until release or abort.

    Its slot holds the conversation's user parts in its first ``user`` positions, then
    possibly the last reply's assistant part, which the next feed drops (:meth:`crop`).
    ``user`` moves when a feed of user rows is done (also for a response cancelled
    meanwhile: the slot and ``user`` never disagree), by ``take_back``, and by a failed
    response's rollback.
    """

    request: Request[Any, Any]
    """The session's request in the engine's step loop (its slot and length)."""
    loop: StepLoop[Any, Any]
    user: int = 0
    reply: int | None = None
    """Tokens of the last reply (what ``truncate`` caps at); None before the first."""
    signal: AbortSignal | None = None
    """Set while a response is generating."""

    def crop(self) -> None:
        """Drop whatever follows the user parts (in order behind work in flight)."""
        self.loop.rewind(self.request, self.user)


@dataclass(frozen=True, slots=True)
class TalkerFeed:
    """A work's payload: prefill ``inputs``, or one frame from ``carry`` and ``text``."""

    inputs: torch.Tensor | None = None
    """[L, Ht] the positions' input embeddings (a prefill)."""
    carry: torch.Tensor | None = None
    """[1, 1, Ht] the previous frame's ``next_input`` (a frame step)."""
    text: torch.Tensor | None = None
    """[1, H] the frame's text input (``ReplyInput.text``)."""
    frame: bool = False
    """Make a frame at the work's last position."""


@dataclass(frozen=True, slots=True)
class Framed:
    """A frame made at a chunk's last position.

    A step of frames alone returns before the device has computed them: ``frame`` is
    set even where its first code turns out to be codec EOS, and :meth:`at_eos` says
    which once ``ready`` has completed (a frame-only step reads back nothing, so the
    host queues the next step while the device runs this one). Other steps know at
    once: ``frame`` is None at EOS and ``eos`` is None.
    """

    frame: Frame
    eos: torch.Tensor | None = None
    """A bool on the host: the frame is codec EOS (valid once ``ready`` completed);
    None: it is not (EOS masked, or known at once)."""
    ready: Completable | None = None
    """Recorded after the frame-only step on a GPU (and ``eos``'s copy to the host);
    None: nothing to wait for."""

    def at_eos(self) -> bool:
        """Whether the frame is codec EOS (waits for ``ready`` if it has not
        completed: await the event first where blocking matters)."""
        if self.frame is None:
            return True
        if self.eos is None:
            return False
        if self.ready is not None:
            self.ready.synchronize()
        return bool(self.eos.item())

    def settled(self) -> Frame:
        """The frame, or None at codec EOS (waits as :meth:`at_eos` does)."""
        return None if self.at_eos() else self.frame


TalkerChunk = Chunk[TalkerFeed, Framed | None]


ROWS_PIECES: Final = 4
"""A step of prefill positions (and frames) runs as rows of the rows graphs, one replay
per ``max_rows`` of them, when it needs at most this many replays; more, and it runs the
prefill forward. On one H200 at full size the forward cost 55-62 ms for a reply's
11-position opening (launches, whatever its length), a whole frame at batch 32 (its
backbone replayed as 32 rows, then the code predictor) 11.5 ms."""


class TalkerModel:
    """The talker of a release, loaded (in the model thread).

    Args:
        path: the release directory (:mod:`.weights`).
        stop_at_codec_eos: let a frame end the reply at codec EOS (else EOS is masked).
        slots: sessions the KV cache holds at once.
        max_context: the most positions one session holds.
        max_rows: the most frame rows one step runs (its largest graph).
        graphs: replay frame-only steps from CUDA graphs (CUDA only).
        warm: capture every frame graph at load.
        capture: how graphs are captured (tests pass a stand-in on a machine without a GPU).
        frame_compile: what of the frame-only step to ``torch.compile`` before its graphs
            are captured (None: nothing; :mod:`.frame_compile`).
        moe: whose forward the MoE experts run (:mod:`.moe`).
        moe_combine: how the lean experts weigh their rows (:data:`.moe.MoeCombine`).
        compile_prefill: the backend its backbone's prefill forwards' layers compile
            with, for any length and any segments (compiled at load); None: not compiled.
        prefill_graphs: on graphs, a request's chunks that start its slot (a session's
            first user rows, or a one-shot reply's whole opening) run as a CUDA graph per
            length bucket of ``prefill_bucket`` positions (captured at load when
            ``warm``), apart from the step's other rows (:meth:`step`).
        prefill_bucket: the length buckets' step.
        prefill_batch: the most such runs of one bucket that share a forward (a graph
            per count, where that many fit ``step_tokens``).
        step_tokens: the most positions a step feeds (the step loop's budget).
        decode_attention: how a frame's backbone rows attend their slots
            (:class:`.SlotCache`): ``gather`` or ``triton`` (in place).

    Attributes:
        text_config: the text model's config.
        speakers: codec id per voice name (lower case): the checkpoint's
            ``talker_config.speaker_id``.
        cache: the KV slots.
    """

    def __init__(
        self,
        path: Path,
        device: torch.device | None = None,
        *,
        stop_at_codec_eos: bool,
        slots: int = 4,
        max_context: int = 4096,
        max_rows: int | None = None,
        graphs: bool = False,
        warm: bool = False,
        capture: Capture | None = None,
        frame_compile: FrameCompile | None = None,
        moe: MoeImplementation = "lean",
        moe_combine: MoeCombine = "triton",
        compile_prefill: Backend | None = None,
        prefill_graphs: bool = False,
        prefill_bucket: int = PREFILL_BUCKET,
        prefill_batch: int = 1,
        step_tokens: int | None = None,
        decode_attention: DecodeAttention = "triton",
    ) -> None:
        device = device or torch.device("cpu")
        if prefill_bucket < 1:
            raise ValueError(f"prefill_bucket must be >= 1, got {prefill_bucket}")
        talker = weights.load(path, "talker", device=device)
        assert isinstance(talker, Qwen3OmniMoeTalkerForConditionalGeneration)
        if moe == "lean":
            # Before the layers are compiled: they trace the experts' forward.
            moe_install(talker.model, moe_combine)
        self._layers: CompiledLayers | None = None
        self._predictor: CompiledCodePredictor | None = None
        if frame_compile is not None:
            if frame_compile.backbone:
                self._layers = CompiledLayers(talker.model.layers, frame_compile.backend)
            if frame_compile.predictor:
                self._predictor = CompiledCodePredictor(
                    talker, frame_compile.backend, fused=frame_compile.fused
                )
        self._prefill_layers = (
            CompiledLayers(talker.model.layers, compile_prefill, "talker prefill", prefill=True)
            if compile_prefill is not None
            else None
        )
        self.max_rows = min(max_rows or slots, slots)
        # Steps that mix prefills with frames run eagerly; their code predictor is
        # launch-bound on a GPU: replay it from CUDA graphs there, per row bucket (as
        # the frame-only steps), compiled as theirs is.
        self._code_frame: CodeFrame
        if device.type == "cuda":
            graphed = GraphedCodePredictor.of_talker(
                talker, buckets=row_buckets(self.max_rows), frame=self._predictor
            )
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
            raise ModelFileError(path / "config.json", problem, layout.remedy(path))
        self.speakers = {str(name).lower(): int(code) for name, code in speakers.items()}
        self._vocab = int(self.text_config.vocab_size)
        self._codec_eos = int(cfg.codec_eos_token_id)
        self.device = device
        self._dtype = next(talker.parameters()).dtype
        self.cache = SlotCache(
            self.text_config,
            slots=slots,
            max_len=max_context,
            device=device,
            dtype=self._dtype,
            decode_attention=decode_attention,
        )
        # The attention of the backbone reads the step's slots (not the code
        # predictor's, a model of its own with its own fresh cache per frame).
        self._configs = attention_configs(talker.model)
        if graphs and device.type != "cuda" and capture is None:
            raise ValueError(f"graphs need a CUDA device, not {device}")
        self._graphs: ShapeGraphs[tuple[int, int]] | None = (
            ShapeGraphs("talker frame", capture=capture) if graphs else None
        )
        self._frame_inputs: dict[tuple[int, int], list[torch.Tensor]] = {}
        # Steps with prefill chunks that fit the largest graph (a reply's opening, user
        # rows sent ahead, beside frames or not): each position a row of the backbone's
        # decode step, replayed per (row bucket, span), captured at load with the frame
        # graphs (``warm``), else on first use. A forward
        # costs a fixed launch overhead on a GPU whatever its length (55-62 ms for an
        # 11-position opening on an H200).
        self._rows_graphs: ShapeGraphs[tuple[int, int]] | None = (
            ShapeGraphs("talker rows", capture=capture) if graphs else None
        )
        self._rows_inputs: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._fresh_graphs: FreshGraphs | None = None
        if graphs and prefill_graphs and prefill_bucket <= max_context:
            self._fresh_graphs = FreshGraphs(
                "talker prefill",
                self.cache,
                prefill_bucket,
                self._fresh,
                capture,
                batch=prefill_batch,
                max_tokens=step_tokens,
            )
        if self._graphs is not None and warm:
            self.warm()
        if self._prefill_layers is not None:
            row = torch.zeros(1, int(self.text_config.hidden_size), dtype=self._dtype)
            warm_prefill(
                talker.model, self.cache, self._configs, row.to(device), self._prefill_layers
            )
        if warm:
            self.warm_prefill_graphs()

    @property
    def talker(self) -> Qwen3OmniMoeTalkerForConditionalGeneration:
        """The HF talker (tests reach its layers to inject failures)."""
        return self._talker

    @property
    def compiled(self) -> dict[str, str]:
        """Per region of the frame-only step (``layers``, ``code_predictor``):
        ``compiled``, ``off``, or why it runs uncompiled after its compile failed."""
        return {
            "layers": compile_status(self._layers),
            "code_predictor": compile_status(self._predictor),
        }

    @property
    def prefill_compiled(self) -> str:
        """Its backbone's prefill forwards' layers: ``compiled``, ``off``, or why they run
        uncompiled after their compile failed."""
        return compile_status(self._prefill_layers)

    @torch.no_grad()
    def user_inputs(self, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[n, Ht] the talker's inputs for user rows [n, H] (``stepping.talker_user_part``)."""
        return stepping.talker_user_part(self._talker, rows[None], rows[None], mask[None])[0]

    @torch.no_grad()
    def opening_inputs(
        self,
        rows: torch.Tensor,
        mask: torch.Tensor,
        opening: torch.Tensor,
        tts: torch.Tensor,
        first: torch.Tensor,
        speaker: int,
    ) -> torch.Tensor:
        """[n + 9, Ht] the user rows left and the assistant prefix (holding token 0)."""
        first_four = torch.cat((opening, first))[None]
        bos_pad = (tts[None, 0:1], tts[None, 2:3])
        inputs = stepping.talker_assistant_prefix(self._talker, first_four, bos_pad, speaker)[0]
        if rows.shape[0]:
            inputs = torch.cat((self.user_inputs(rows, mask), inputs))
        return inputs

    # -- the step -----------------------------------------------------------------------

    def frame_keys(self) -> list[tuple[int, int]]:
        """Every (row bucket, span) a frame-only step may need, smallest first."""
        return self.cache.graph_keys(self.max_rows)

    @property
    def graphed(self) -> list[tuple[int, int]]:
        """(row bucket, span) pairs replayed from a graph."""
        return sorted(self._graphs.graphed) if self._graphs is not None else []

    @property
    def eager_steps(self) -> int | None:
        """Steps run eager for want of a graph: frame-only steps (more rows than
        ``max_rows``, a shape whose graph failed or differed; not ``step(eager=True)``)
        and the code predictor of mixed steps on a GPU (a batch size whose graph failed
        or differed); None without graphs."""
        graphed = self._code_frame if isinstance(self._code_frame, GraphedCodePredictor) else None
        parts = (self._graphs, self._rows_graphs, graphed, self._fresh_graphs)
        counts = [part.eager_steps for part in parts if part is not None]
        return sum(counts) if counts else None

    def prefill_sizes(self) -> list[int]:
        """The lengths fresh prefill graphs are captured for, smallest first."""
        return self._fresh_graphs.sizes if self._fresh_graphs is not None else []

    @property
    def prefill_graphed(self) -> list[tuple[int, ...]]:
        """(runs, length) shapes whose fresh prefill replays from a graph."""
        return self._fresh_graphs.graphed if self._fresh_graphs is not None else []

    @property
    def capture_s(self) -> dict[tuple[int, int], float]:
        """Seconds each (row bucket, span) took to capture and check."""
        return dict(self._graphs.capture_s) if self._graphs is not None else {}

    @torch.no_grad()
    def warm(self) -> list[tuple[int, int]]:
        """Capture every frame graph and every rows graph now (at load, while nothing
        else runs on the device): steps the scratch row only."""
        if self._graphs is None:
            return []
        for key in self.frame_keys():
            static = self._static_inputs(key)
            self._graphs.capture(key, functools.partial(self._frame_step, key[1]), *static)
        if self._rows_graphs is not None:
            # Steps of prefill rows (a reply's opening) too: the first one captured while
            # serving compiled its layers again for the new inputs, 5.4 s of the first
            # reply's first packet on an H200.
            for key in self.frame_keys():
                backbone = functools.partial(self._backbone_rows, key[1])
                self._rows_graphs.capture(key, backbone, *self._rows_static(key))
        if isinstance(self._code_frame, GraphedCodePredictor):  # the mixed steps'
            for rows in row_buckets(self.max_rows):
                self._code_frame.warm(rows)
        return self.graphed

    @torch.no_grad()
    def warm_prefill_graphs(self) -> list[tuple[int, ...]]:
        """Capture every fresh prefill graph now (after the prefill layers compiled), over
        the scratch slot."""
        if self._fresh_graphs is not None:
            width = int(self.text_config.hidden_size)
            self._fresh_graphs.warm(torch.zeros(1, width, dtype=self._dtype, device=self.device))
        return self.prefill_graphed

    @torch.no_grad()
    def step(self, chunks: list[TalkerChunk], *, eager: bool = False) -> list[Framed | None]:
        """One forward over every chunk (module docstring); one output per chunk: the
        frame where a chunk ends a work that makes one. ``eager`` runs a frame-only
        step without its graph (a benchmark compares). With fresh prefill graphs, each
        request's chunks that start its slot replay the graph of their length, and the
        step's other chunks run as a step of their own (they read other slots: the
        order does not matter)."""
        rest = functools.partial(self._step, eager=eager)
        if eager or self._fresh_graphs is None:
            return rest(chunks)
        return self._fresh_graphs.step(chunks, self._fresh_runs, rest)

    def _fresh_runs(
        self, runs: list[list[TalkerChunk]], rows: list[TalkerChunk]
    ) -> list[Framed | None]:
        """Requests' chunks from the start of their slots, one length bucket's, from the
        fresh prefill graph of that bucket and their count (each run padded with copies
        of its last input): an output per chunk, in order. A frame row runs the code
        predictor after the backbone, so none rides in a fresh forward (``rows`` is
        empty: the graphs take none)."""
        assert self._fresh_graphs is not None
        assert not rows, "frame rows never ride in a fresh forward"
        embeds = [torch.cat([_inputs(c) for c in run]).to(self.device, self._dtype) for run in runs]
        outputs = self._fresh_graphs(embeds, [run[0].request.slot for run in runs])
        states = torch.cat([output[0] for output in outputs])
        return self._framed([chunk for run in runs for chunk in run], states)

    def _fresh(self, embeds: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor]:
        """The backbone over ``embeds`` [K * L, Ht], ``K`` runs of ``L`` positions each from
        the start of its slot of ``slots`` [K]: its last states [K * L, Ht] (capturable)."""
        step = self.cache.fresh_step(slots, embeds.shape[0] // slots.shape[0])
        model = self._talker.model
        return (prefill_forward(model, step, self._configs, embeds, self._prefill_layers)[0],)

    def _step(self, chunks: list[TalkerChunk], eager: bool) -> list[Framed | None]:
        """:meth:`step` without fresh prefill graphs."""
        if all(chunk.work.decode for chunk in chunks):
            return self._frames_step(chunks, eager)
        talker = self._talker
        decodes = [c for c in chunks if c.work.decode]
        stepped: dict[int, torch.Tensor] = {}
        if decodes:
            carry = torch.cat([_carry(c) for c in decodes])
            text = torch.cat([_text(c) for c in decodes])
            inputs = carry + talker.text_projection(text[:, None])
            stepped = {id(c): inputs[n, 0:1] for n, c in enumerate(decodes)}
        parts = [stepped[id(c)] if c.work.decode else _inputs(c) for c in chunks]
        embeds = torch.cat(parts).to(self._dtype)
        pieces = -(-embeds.shape[0] // self.max_rows)
        if self._rows_graphs is not None and not eager and pieces <= ROWS_PIECES:
            states = self._rows_step(chunks, embeds)
        else:
            step = self.cache.step([Segment(c.request.slot, c.start, c.length) for c in chunks])
            layers = self._prefill_layers
            states = prefill_forward(talker.model, step, self._configs, embeds, layers)[0]
        return self._framed(chunks, states)

    def _framed(self, chunks: list[TalkerChunk], states: torch.Tensor) -> list[Framed | None]:
        """Each chunk's output from the backbone's last states [T, Ht] over the chunks'
        positions in order: the frame of each chunk that ends a work making one."""
        wanted = [n for n, c in enumerate(chunks) if c.last and c.work.payload.frame]
        results: list[Framed | None] = [None] * len(chunks)
        if not wanted:
            return results
        ends = torch.tensor([c.length for c in chunks]).cumsum(0) - 1
        index = ends[torch.tensor(wanted)].to(self.device)
        hidden = states.index_select(0, index)[:, None]
        frames = self._complete(hidden, self._talker.codec_head(hidden)[:, -1])
        for n, frame in zip(wanted, frames, strict=True):
            results[n] = Framed(frame)
        return results

    def _rows_step(self, chunks: list[TalkerChunk], embeds: torch.Tensor) -> torch.Tensor:
        """The backbone's last states [T, Ht] over the step's ``embeds`` [T, Ht], each
        position a row of its own (a row sees the rows of its slot before it: every
        key is written before any row attends), replayed from a graph per (row
        bucket, span); in pieces of ``max_rows`` positions, in order, where there are
        more (a piece's rows see the keys the pieces before it wrote)."""
        slots = [c.request.slot for c in chunks for _ in range(c.length)]
        starts = [p for c in chunks for p in range(c.start, c.start + c.length)]
        states = [
            self._rows_piece(
                slots[first : first + self.max_rows],
                starts[first : first + self.max_rows],
                embeds[first : first + self.max_rows],
            )
            for first in range(0, len(starts), self.max_rows)
        ]
        return states[0] if len(states) == 1 else torch.cat(states)

    def _rows_piece(
        self, slots: list[int], starts: list[int], embeds: torch.Tensor
    ) -> torch.Tensor:
        """One replay of a rows graph: at most ``max_rows`` positions."""
        count = len(starts)
        rows = bucket(count, row_buckets(self.max_rows)) or count
        span = span_for(max(starts) + 1, self.cache.max_len)
        pad = rows - count
        padding = embeds.new_zeros(pad, embeds.shape[1])
        given = [
            torch.tensor(slots + [self.cache.scratch] * pad, device=self.device),
            torch.tensor(starts + [0] * pad, device=self.device),
            torch.cat((embeds, padding)),
        ]
        key = (rows, span)
        static = self._rows_static(key)
        for buffer, value in zip(static, given, strict=True):
            buffer.copy_(value)
        assert self._rows_graphs is not None
        (states,) = self._rows_graphs(key, functools.partial(self._backbone_rows, span), *static)
        return states[:count]

    def _rows_static(self, key: tuple[int, int]) -> list[torch.Tensor]:
        """The rows graph's inputs for ``key``: slots (scratch), starts, embeddings."""
        static = self._rows_inputs.get(key)
        if static is None:
            rows = key[0]
            width = int(self.text_config.hidden_size)
            with torch.device(self.device):
                static = [
                    torch.full((rows,), self.cache.scratch, dtype=torch.long),
                    torch.zeros(rows, dtype=torch.long),
                    torch.zeros(rows, width, dtype=self._dtype),
                ]
            self._rows_inputs[key] = static
        return static

    def _backbone_rows(
        self, span: int, slots: torch.Tensor, starts: torch.Tensor, embeds: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The backbone over single-position rows (capturable: a function of its input
        tensors, nothing read back to the host)."""
        step = self.cache.decode_step(slots, starts, span)
        layers = self._layers.active() if self._layers is not None else contextlib.nullcontext()
        with step.active(self._configs), layers:
            out = self._talker.model(
                inputs_embeds=embeds[None],
                position_ids=starts[None],
                attention_mask=step.mask,
                past_key_values=step,
                use_cache=True,
            )
        return (out.last_hidden_state[0],)

    def _frames_step(self, chunks: list[TalkerChunk], eager: bool) -> list[Framed | None]:
        """Frame rows alone: a graph per (row bucket, span) where there is one; returns
        once queued (codec EOS read back behind it, see :class:`Framed`)."""
        count = len(chunks)
        rows = bucket(count, row_buckets(self.max_rows)) or count
        span = span_for(max(c.start for c in chunks) + 1, self.cache.max_len)
        pad = rows - count
        slots = [c.request.slot for c in chunks] + [self.cache.scratch] * pad
        starts = [c.start for c in chunks] + [0] * pad
        carry = torch.cat([_carry(c) for c in chunks]).to(self.device, self._dtype)
        text = torch.cat([_text(c) for c in chunks]).to(self.device, self._dtype)
        if pad:
            carry = torch.cat((carry, carry[-1:].expand(pad, *carry.shape[1:])))
            text = torch.cat((text, text[-1:].expand(pad, *text.shape[1:])))
        given = [_on_device(v, self.device) for v in (slots, starts)] + [carry, text]
        key = (rows, span)
        if eager or self._graphs is None:
            codes, carries = self._frame_step(span, *given)
        elif count > self.max_rows:
            step = functools.partial(self._frame_step, span)
            codes, carries = self._graphs.run_eager(step, *given)
        else:
            static = self._static_inputs(key)
            for buffer, value in zip(static, given, strict=True):
                buffer.copy_(value)
            graph = functools.partial(self._frame_step, span)
            codes, carries = self._graphs(key, graph, *static)
        frames = [(codes[row : row + 1], carries[row : row + 1]) for row in range(count)]
        # Read back which rows are at EOS without waiting for the step: the caller
        # waits for ``ready`` once it has queued what it can (the next frames). With
        # EOS masked nothing is read back, but ``ready`` still says when the step is
        # done: the engine's next step waits for it, so the device's queue holds one
        # step behind the one it runs, not the whole reply.
        eos: torch.Tensor | None = None
        if self._stop_at_codec_eos:
            eos = codes[:count, 0] == self._codec_eos
        ready = None
        if codes.is_cuda:
            if eos is not None:
                host = torch.empty(eos.shape, dtype=torch.bool, device="cpu", pin_memory=True)
                eos = host.copy_(eos, non_blocking=True)
            # Blocking: the threads that wait for it (the step loop's pacing, the
            # sessions' event waiter) sleep until the device is done rather than spin
            # a core each; the device does not wait for their wake-up, as the next step
            # is queued behind this one by then.
            ready = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
            ready.record()
        return [
            Framed(frame, None if eos is None else eos[row], ready)
            for row, frame in enumerate(frames)
        ]

    def _static_inputs(self, key: tuple[int, int]) -> list[torch.Tensor]:
        static = self._frame_inputs.get(key)
        if static is None:
            rows = key[0]
            width = int(self.text_config.hidden_size)
            text = int(self._talker.config.thinker_hidden_size)
            with torch.device(self.device):
                static = [
                    torch.full((rows,), self.cache.scratch, dtype=torch.long),
                    torch.zeros(rows, dtype=torch.long),
                    torch.zeros(rows, 1, width, dtype=self._dtype),
                    torch.zeros(rows, text, dtype=self._dtype),
                ]
            self._frame_inputs[key] = static
        return static

    def _frame_step(
        self,
        span: int,
        slots: torch.Tensor,
        starts: torch.Tensor,
        carry: torch.Tensor,
        text: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """The frame-only step: ``(codes [B, groups], next_input [B, 1, Ht])``; codes of
        a row at codec EOS start with EOS (the caller ends that reply). Capturable: a
        function of its input tensors, nothing read back to the host."""
        talker = self._talker
        inputs = carry + talker.text_projection(text[:, None])
        (states,) = self._backbone_rows(span, slots, starts, inputs.reshape(-1, inputs.shape[-1]))
        hidden = states[:, None]  # [B, 1, Ht]
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


def _on_device(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``, copied from pinned memory without waiting
    for the work queued on the device (a plain copy would wait for the step before)."""
    host = torch.tensor(values, device="cpu")
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _inputs(chunk: TalkerChunk) -> torch.Tensor:
    """The input embeddings of a prefill chunk's positions [length, Ht]."""
    given = chunk.work.payload.inputs
    assert given is not None, "a prefill feeds inputs"
    return given[chunk.offset : chunk.offset + chunk.length]


def _carry(chunk: TalkerChunk) -> torch.Tensor:
    carry = chunk.work.payload.carry
    assert carry is not None, "a frame step carries the previous frame"
    return carry


def _text(chunk: TalkerChunk) -> torch.Tensor:
    text = chunk.work.payload.text
    assert text is not None, "a frame step has its text"
    return text
