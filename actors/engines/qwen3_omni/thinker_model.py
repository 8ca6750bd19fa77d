"""``ThinkerModel``: the loaded thinker and the one step its engine's loop runs.

Everything here runs in the engine's model thread (``TorchEngine.call``). The engine's
:class:`~omni_actors.actors.engines.step_loop.StepLoop` decides what each step feeds
(decode rows of some sessions, prefill chunks of others); :meth:`ThinkerModel.step`
computes that step in one forward over the :class:`~.slot_cache.SlotCache`, the
thinker's only KV cache, and returns each chunk's output: the talker's rows of the
positions it fed, and, where a chunk ends a work that asks for it, the next token
picked from its last position. A step of decode rows alone replays a CUDA graph per
(row bucket, span) on a GPU.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import torch

from omni_actors.actors.engines.qwen3_omni import configs, layout, stepping, weights
from omni_actors.actors.engines.qwen3_omni.audio_stream import AudioClip
from omni_actors.actors.engines.qwen3_omni.frame_compile import (
    Backend,
    CompiledLayers,
    compile_status,
    prefill_forward,
    warm_prefill,
)
from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs, bucket
from omni_actors.actors.engines.qwen3_omni.hf import (
    PreTrainedConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    WhisperFeatureExtractor,
)
from omni_actors.actors.engines.qwen3_omni.log_mel import LogMel
from omni_actors.actors.engines.qwen3_omni.moe import MoeCombine, MoeImplementation
from omni_actors.actors.engines.qwen3_omni.moe import install as moe_install
from omni_actors.actors.engines.qwen3_omni.sampling import Sampling, draw
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
from omni_actors.actors.engines.qwen3_omni.user_turn import UserTurn
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.actors.engines.step_loop import Chunk
from omni_actors.cuda.step_ready import cat_ready, mark_step
from omni_actors.errors import ModelFileError
from omni_actors.models.files import read_json
from omni_actors.models.release import Release

__all__ = ["Fed", "Feeding", "Pick", "ThinkerModel", "Token"]

_PREPROCESSOR: Final = "preprocessor_config.json"

ROWS_PIECES: Final = 2
"""A step with prefill chunks (text) runs as rows of the decode graphs, one replay per
``max_rows`` positions, when it needs at most this many replays; more, and it runs the
prefill forward. On one H200 an 8-layer thinker's forward cost 23 ms for 19 positions
(about 95 ms at full size, whatever the length up to thousands), its 32-row decode step
7 ms compiled: two replays stay under one forward at either size."""

Token = tuple[int, torch.Tensor]
"""A picked token and its [1, H] input embedding."""


@dataclass(frozen=True, slots=True)
class Pick:
    """Pick a token from a work's last position."""

    allow_end: bool
    sampling: Sampling


@dataclass(frozen=True, slots=True)
class Feeding:
    """A work's payload: the ids to feed, the audio embeddings of their AUDIO_PADs."""

    ids: list[int]
    audio: torch.Tensor | None = None
    """[n, H] encoder output for the ``n`` AUDIO_PAD ids, in order."""
    rows: bool = False
    """Return the talker's rows of the positions fed."""
    pick: Pick | None = None


@dataclass(frozen=True, slots=True)
class Fed:
    """One chunk's output."""

    rows: torch.Tensor | None
    """[L, H]: the input embedding per position, the ``accept_hidden_layer`` state at
    AUDIO_PAD positions (``stepping.talker_user_part`` selects between the two by the
    placeholder mask, so one tensor carries what it needs)."""
    token: Token | None
    """The token picked at the chunk's last position (last chunk of a picking work)."""


ThinkerChunk = Chunk[Feeding, Fed]


class ThinkerModel:
    """The thinker of a release, loaded (in the model thread).

    Args:
        path: the release directory (:mod:`.weights`).
        allowed_token_ranges: half-open ``[start, stop)`` id ranges a reply may use
            (``<|im_end|>`` is allowed once the reply's minimum is reached); None: any.
            For random weights, which would otherwise pick ids no reader could show.
        slots: sessions the KV cache holds at once.
        max_context: the most positions one session holds.
        max_rows: the most decode rows one step runs (its largest graph).
        graphs: replay decode-only steps from CUDA graphs (CUDA only).
        warm: capture every decode graph at load.
        capture: how graphs are captured (tests pass a stand-in on a machine without a GPU).
        moe: whose forward the MoE experts run (:mod:`.moe`).
        moe_combine: how the lean experts weigh their rows (:data:`.moe.MoeCombine`).
        compile_layers: the ``torch.compile`` backend its decode steps' layers compile
            with before their graphs are captured (:class:`.frame_compile.CompiledLayers`);
            None: not compiled.
        compile_prefill: the backend its prefill forwards' layers compile with, for any
            length and any segments (compiled at load); None: not compiled.
        prefill_graphs: on graphs, a request's chunks that start its slot (a
            conversation's first prompt and the reply's opening after it) run as a CUDA
            graph per length bucket of ``prefill_bucket`` positions (captured at load
            when ``warm``), apart from the step's other rows (:meth:`step`).
        prefill_bucket: the length buckets' step.
        prefill_batch: the most such runs of one bucket that share a forward (a graph
            per count, where that many fit ``step_tokens``).
        step_tokens: the most positions a step feeds (the step loop's budget).
        prefill_rows: the most decode rows a fresh prefill graph runs beside its
            prompts, in the same forward (each graph then takes that many, padded, and
            those rows attend the slot's whole ``max_context``); 0: they run as a
            decode step of their own. At most ``max_rows``.
        decode_attention: how single-position rows attend their slots
            (:class:`.SlotCache`): ``gather`` or ``triton`` (in place).

    Raises:
        ModelFileError: a file of the stage, its tokenizer or front end, or the composite
            ``config.json`` beside it, is missing or corrupt (see :func:`.weights.load`
            and :meth:`.Vocabulary.load`).
        ValueError: a range of ``allowed_token_ranges`` is empty or outside the
            vocabulary.

    Attributes:
        text_config: the text model's config.
        vocabulary: the release's tokenizer and special ids.
        tts: [3, H] the embeddings of TTS_BOS, TTS_EOS, TTS_PAD.
        opening: [3, H] the embeddings of ``<|im_start|> assistant \\n``.
        cache: the KV slots.
    """

    def __init__(
        self,
        path: Path,
        device: torch.device | None = None,
        *,
        allowed_token_ranges: list[tuple[int, int]] | None = None,
        slots: int = 4,
        max_context: int = 4096,
        max_rows: int | None = None,
        graphs: bool = False,
        warm: bool = False,
        capture: Capture | None = None,
        moe: MoeImplementation = "lean",
        moe_combine: MoeCombine = "triton",
        compile_layers: Backend | None = None,
        compile_prefill: Backend | None = None,
        prefill_graphs: bool = False,
        prefill_bucket: int = PREFILL_BUCKET,
        prefill_batch: int = 1,
        step_tokens: int | None = None,
        prefill_rows: int = 0,
        decode_attention: DecodeAttention = "triton",
    ) -> None:
        device = device or torch.device("cpu")
        if prefill_bucket < 1:
            raise ValueError(f"prefill_bucket must be >= 1, got {prefill_bucket}")
        release = Release.open(path, remedy=layout.remedy(path))
        thinker = weights.load(path, "thinker", device=device, release=release)
        assert isinstance(thinker, Qwen3OmniMoeThinkerForConditionalGeneration)
        if moe == "lean":
            # Before the layers are compiled: they trace the experts' forward.
            moe_install(thinker.model, moe_combine)
        self._layers = (
            CompiledLayers(thinker.model.layers, compile_layers, name="thinker layers")
            if compile_layers is not None
            else None
        )
        self._prefill_layers = (
            CompiledLayers(thinker.model.layers, compile_prefill, "thinker prefill", prefill=True)
            if compile_prefill is not None
            else None
        )
        self._thinker = thinker
        self._accept_layer = layout.accept_hidden_layer(release.config, path / "config.json")
        # After the config's own checks: AutoTokenizer reads config.json too, and would
        # blame the directory for a config it cannot parse.
        self.vocabulary = vocabulary = Vocabulary.load(path)
        ids = vocabulary.ids
        self.text_config = cast(PreTrainedConfig, thinker.config.text_config)
        audio = cast(PreTrainedConfig, thinker.config.audio_config)
        self._n_window, self._n_window_infer = int(audio.n_window), int(audio.n_window_infer)
        # Annotated from transformers 5.23 on, untyped before: the ignore serves the
        # older releases of the supported range and is unused on newer ones.
        self._embedding = thinker.get_input_embeddings()  # type: ignore[no-untyped-call,unused-ignore]
        self._extractor = _feature_extractor(path)
        vocab = int(self.text_config.vocab_size)
        with torch.device(device):
            if allowed_token_ranges is None:
                self._allow_text = torch.zeros(vocab)
            else:
                self._allow_text = torch.full((vocab,), float("-inf"))
                for start, stop in allowed_token_ranges:
                    if not 0 <= start < stop <= vocab:
                        raise ValueError(
                            f"allowed_token_ranges has [{start}, {stop}), which is empty or "
                            f"outside the thinker's vocabulary [0, {vocab})"
                        )
                    self._allow_text[start:stop] = 0.0
            self._allow_end = self._allow_text.clone()
            self._allow_text[ids.im_end] = float("-inf")
            self._allow_end[ids.im_end] = 0.0
            self._allow = torch.stack((self._allow_text, self._allow_end))
            # No graph: weights.load turned gradients off.
            tts = torch.tensor([ids.tts_bos, ids.tts_eos, ids.tts_pad])
            self.tts = self._embedding(tts)
            self.opening = self._embedding(torch.tensor(vocabulary.assistant_opening))
        self._side_stream = (
            torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            if device.type == "cuda"
            else None
        )
        if device.type == "cuda":
            # Every reply's first output carries these: unmarked, its copy to the talker
            # would wait for all the thinker had queued by then (a whole prefill step of
            # other prompts in a wave), and the talker's step reading it with it.
            mark_step((self.tts, self.opening), device)
        self.device = device
        self.cache = SlotCache(
            self.text_config,
            slots=slots,
            max_len=max_context,
            device=device,
            dtype=self.tts.dtype,
            decode_attention=decode_attention,
        )
        self.max_rows = min(max_rows or slots, slots)
        # The attention of every module of the text model reads the step's slots.
        self._configs = attention_configs(thinker.model)
        if graphs and device.type != "cuda" and capture is None:
            raise ValueError(f"graphs need a CUDA device, not {device}")
        self._graphs: ShapeGraphs[tuple[int, int]] | None = (
            ShapeGraphs("thinker decode", capture=capture) if graphs else None
        )
        self._decode_inputs: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._fresh_graphs: FreshGraphs | None = None
        if graphs and prefill_graphs and prefill_bucket <= max_context:
            self._fresh_graphs = FreshGraphs(
                "thinker prefill",
                self.cache,
                prefill_bucket,
                self._fresh,
                capture,
                batch=prefill_batch,
                max_tokens=step_tokens,
                rows=min(prefill_rows, self.max_rows),
            )
        if self._graphs is not None and warm:
            self.warm()
        if self._prefill_layers is not None:
            warm_prefill(
                thinker.model, self.cache, self._configs, self.tts[:1], self._prefill_layers
            )
        if warm:
            self.warm_prefill_graphs()

    def clip(self) -> AudioClip:
        """A new audio clip, windowed as this thinker's audio encoder attends."""
        mel = LogMel(self._extractor, block=2 * self._n_window)
        return AudioClip(mel, self._n_window, self._n_window_infer)

    def audio(self, turn: UserTurn, end_clip: bool) -> torch.Tensor | None:
        """The encoder's output for the turn's clip's new windows (all that is left of it
        if ``end_clip``); None when no window is whole yet."""
        if turn.clip is None:
            return None
        encode = self._encode
        return turn.clip.finish(encode) if end_clip else turn.clip.windows(encode)

    # -- the step -----------------------------------------------------------------------

    def decode_keys(self) -> list[tuple[int, int]]:
        """Every (row bucket, span) a decode-only step may need, smallest first."""
        return self.cache.graph_keys(self.max_rows)

    @property
    def graphed(self) -> list[tuple[int, int]]:
        """(row bucket, span) pairs replayed from a graph."""
        return sorted(self._graphs.graphed) if self._graphs is not None else []

    @property
    def compiled(self) -> str:
        """Its decode step's layers: ``compiled``, ``off``, or why they run uncompiled
        after their compile failed."""
        return compile_status(self._layers)

    @property
    def prefill_compiled(self) -> str:
        """Its prefill forwards' layers, as :attr:`compiled` says the decode step's."""
        return compile_status(self._prefill_layers)

    @property
    def eager_steps(self) -> int | None:
        """Decode-only steps run eager for want of a graph (more rows than ``max_rows``,
        a shape whose graph failed or differed; not ``step(eager=True)``); None
        without graphs."""
        if self._graphs is None:
            return None
        fresh = self._fresh_graphs.eager_steps if self._fresh_graphs is not None else 0
        return self._graphs.eager_steps + fresh

    def prefill_sizes(self) -> list[int]:
        """The lengths fresh prefill graphs are captured for, smallest first."""
        return self._fresh_graphs.sizes if self._fresh_graphs is not None else []

    @property
    def prefill_graphed(self) -> list[tuple[int, ...]]:
        """(runs, length) shapes whose fresh prefill replays from a graph; (runs,
        length, rows) those with decode rows beside them."""
        return self._fresh_graphs.graphed if self._fresh_graphs is not None else []

    @torch.no_grad()
    def warm(self) -> list[tuple[int, int]]:
        """Capture every decode graph now (at load, while nothing else runs on the
        device): steps the scratch row only."""
        if self._graphs is None:
            return []
        for key in self.decode_keys():
            static = self._static_inputs(key)
            self._graphs.capture(key, functools.partial(self._decode, key[1]), *static)
        return self.graphed

    @torch.no_grad()
    def warm_prefill_graphs(
        self, keys: Sequence[tuple[int, ...]] | None = None
    ) -> list[tuple[int, ...]]:
        """Capture every fresh prefill graph now (after the prefill layers compiled), or
        those of ``keys`` (``(runs, length)``, or ``(runs, length, rows)``), over the
        scratch slot."""
        if self._fresh_graphs is not None:
            self._fresh_graphs.warm(self.tts[:1], keys)
        return self.prefill_graphed

    def cat_rows(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """``parts`` joined along dim 0, on the event loop: on a GPU on a stream of the
        thinker's own once the steps that made them are done, the result marked
        (:func:`~omni_actors.cuda.step_ready.cat_ready`), so that its copy to the talker
        waits for those steps, not for the one queued since."""
        if self._side_stream is None or not parts[0].is_cuda:
            return torch.cat(list(parts))
        return cat_ready(parts, self._side_stream, torch.cuda.current_stream(self.device))

    @torch.no_grad()
    def text_rows(self, ids: list[int]) -> torch.Tensor:
        """[L, H] the talker's rows of text positions ``ids``: their input embeddings,
        which no forward changes (:attr:`Fed.rows`), so they may go before it.

        Called on the event loop, not in the model thread: a lookup queued behind the
        step the model thread runs (a wave's prefill, 120 ms at full size) would hold the
        prompt's rows, and the prompt, that long. On a GPU it runs on a stream of the
        thinker's own and is marked there (:mod:`omni_actors.cuda.step_ready`), so their
        copy to the talker waits for it alone.
        """
        if self._side_stream is None:
            rows: torch.Tensor = self._embedding(torch.tensor(ids, device=self.device))
            return rows
        with torch.cuda.stream(self._side_stream):
            rows = self._embedding(torch.tensor(ids, device=self.device))
            mark_step(rows, self.device)
        return rows

    @torch.no_grad()
    def step(self, chunks: list[ThinkerChunk], *, eager: bool = False) -> list[Fed]:
        """One forward over every chunk (module docstring); one output per chunk.
        ``eager`` runs a decode-only step without its graph (a benchmark compares)."""
        rest = functools.partial(self._step, eager=eager)
        if eager or self._fresh_graphs is None:
            return rest(chunks)
        return self._fresh_graphs.step(chunks, self._fresh_runs, rest)

    def _step(self, chunks: list[ThinkerChunk], eager: bool) -> list[Fed]:
        """:meth:`step` without fresh prefill graphs."""
        if all(chunk.work.decode for chunk in chunks):
            return self._rows_step(chunks, eager)
        if not eager and self._as_rows(chunks):
            return self._rows_step(chunks, eager)
        segments = [Segment(c.request.slot, c.start, c.length) for c in chunks]
        embeds, pads = self._inputs(chunks)
        want_rows = any(c.work.payload.rows for c in chunks)
        with self._accept_states(want_rows) as states:
            last = self._prefill(segments, embeds)
        accept = None
        if want_rows:
            accept = (states[0] if states else last)[0]
            if self._accept_layer == 0:
                accept = embeds
        return self._outputs(chunks, last[0], accept, embeds, pads)

    def _inputs(self, chunks: list[ThinkerChunk]) -> tuple[torch.Tensor, torch.Tensor]:
        """The input embeddings [T, H] of the chunks' positions in token order (audio
        embeddings at AUDIO_PADs), and where the AUDIO_PADs are [T]."""
        ids = [i for c in chunks for i in c.work.payload.ids[c.offset : c.offset + c.length]]
        device = self.device
        embeds = self._embedding(torch.tensor(ids, device=device))
        audio = self._audio_rows(chunks)
        pads = torch.tensor(ids, device=device) == self.vocabulary.ids.audio_pad
        if audio is not None:
            embeds = embeds.masked_scatter(pads[:, None].expand_as(embeds), audio.to(embeds))
        return embeds, pads

    def _outputs(
        self,
        chunks: list[ThinkerChunk],
        last: torch.Tensor,
        accept: torch.Tensor | None,
        embeds: torch.Tensor,
        pads: torch.Tensor,
    ) -> list[Fed]:
        """Each chunk's output from the forward's last hidden states [T, H] and the
        talker's source rows ``accept`` [T, H] (None: no chunk wants rows)."""
        ends = torch.tensor([c.length for c in chunks]).cumsum(0) - 1
        logits = self._thinker.lm_head(last[ends.to(self.device)])
        picks = self._picks(logits, chunks)
        fed: list[Fed] = []
        offset = 0
        for chunk, token in zip(chunks, picks, strict=True):
            rows = None
            if accept is not None and chunk.work.payload.rows:
                span = slice(offset, offset + chunk.length)
                rows = torch.where(pads[span, None], accept[span], embeds[span])
            fed.append(Fed(rows, token))
            offset += chunk.length
        return fed

    def _fresh_runs(self, runs: list[list[ThinkerChunk]], rows: list[ThinkerChunk]) -> list[Fed]:
        """Requests' chunks from the start of their slots, one length bucket's, from the
        fresh prefill graph of that bucket and their count (each run padded with copies
        of its last input), and decode ``rows`` in the same forward: an output per chunk
        of the runs, in order, then one per row."""
        assert self._fresh_graphs is not None
        chunks = [chunk for run in runs for chunk in run] + rows
        embeds, pads = self._inputs(chunks)
        lengths = [sum(chunk.length for chunk in run) for run in runs]
        runs_embeds = torch.split(embeds, [*lengths, len(rows)])
        given = None
        if rows:
            given = (runs_embeds[-1], [r.request.slot for r in rows], [r.start for r in rows])
        slots = [run[0].request.slot for run in runs]
        outputs = self._fresh_graphs(runs_embeds[: len(runs)], slots, given)
        last = torch.cat([output[0] for output in outputs])
        want_rows = any(c.work.payload.rows for c in chunks)
        accept = torch.cat([output[1] for output in outputs]) if want_rows else None
        return self._outputs(chunks, last, accept, embeds, pads)

    def _fresh(
        self,
        embeds: torch.Tensor,
        slots: torch.Tensor,
        row_slots: torch.Tensor | None = None,
        row_starts: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward over ``embeds`` [K * L + R, H], ``K`` runs of ``L`` positions each
        from the start of its slot of ``slots`` [K], then ``R`` decode rows at
        ``row_starts`` of ``row_slots`` (none without them): the last hidden states and
        the talker's source rows, [K * L + R, H] each (capturable)."""
        if row_slots is None or row_starts is None:
            step = self.cache.fresh_step(slots, embeds.shape[0] // slots.shape[0])
        else:
            length = (embeds.shape[0] - row_slots.shape[0]) // slots.shape[0]
            step = self.cache.fresh_rows_step(slots, length, row_slots, row_starts)
        with self._accept_states(True) as states:
            last = prefill_forward(
                self._thinker.model, step, self._configs, embeds, self._prefill_layers
            )
        accept = embeds if self._accept_layer == 0 else (states[0] if states else last)[0]
        return last[0], accept

    def _prefill(self, segments: list[Segment], embeds: torch.Tensor) -> torch.Tensor:
        """The text model's forward over ``segments``' positions, their inputs ``embeds``
        [T, H] in token order: the last hidden states [1, T, H]."""
        step = self.cache.step(segments)
        model = self._thinker.model
        return prefill_forward(model, step, self._configs, embeds, self._prefill_layers)

    @contextlib.contextmanager
    def _accept_states(self, wanted: bool) -> Iterator[list[torch.Tensor]]:
        """Meanwhile, the output of the layer before ``accept_hidden_layer`` (HF's
        ``hidden_states[accept_hidden_layer]``) is appended to the list yielded, when
        ``wanted`` and that layer is not the last (the last is the normed
        ``last_hidden_state``, as HF ties it; 0 is the input embeddings).

        A hook on that one layer, not ``output_hidden_states``: that installs
        transformers' output-capturing hooks on every attention and router module for
        good, and each would break a compiled decode layer's graph (a ``ContextVar``
        read dynamo cannot trace)."""
        states: list[torch.Tensor] = []
        layers = self._thinker.model.layers
        if not wanted or not 0 < self._accept_layer < len(layers):
            yield states
            return

        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            states.append(output[0] if isinstance(output, tuple) else output)

        handle = layers[self._accept_layer - 1].register_forward_hook(keep)
        try:
            yield states
        finally:
            handle.remove()

    def _as_rows(self, chunks: list[ThinkerChunk]) -> bool:
        """Whether a step with prefill chunks may run as single positions, one row each,
        through the decode graphs: on graphs, text only, no more positions than
        :data:`ROWS_PIECES` replays of the largest graph hold. A forward costs a fixed
        launch overhead on a GPU whatever its length (a reply's opening of 5 positions
        as much as a 2500-token prompt); a graph replays it for a decode step's cost. A
        row at position ``p`` of a slot sees the rows before it in the same step, as a
        chunk's positions see each other: every row's key is written before any row
        attends (:class:`.SlotStep`)."""
        pieces = -(-sum(c.length for c in chunks) // self.max_rows)
        if self._graphs is None or pieces > ROWS_PIECES:
            return False
        pad = self.vocabulary.ids.audio_pad
        return all(
            c.work.payload.audio is None
            and pad not in c.work.payload.ids[c.offset : c.offset + c.length]
            for c in chunks
        )

    def _rows_step(self, chunks: list[ThinkerChunk], eager: bool) -> list[Fed]:
        """Every position of the step a row of its own (decode rows, and prefill chunks
        :meth:`_as_rows` takes): a graph per (row bucket, span) where there is one; a
        step with prefill chunks of more positions than the largest graph's rows runs
        in pieces of ``max_rows`` positions, in order (a piece's rows see the keys the
        pieces before it wrote)."""
        slots: list[int] = []
        starts: list[int] = []
        ids: list[int] = []
        last: list[int] = []  # each chunk's last row
        for c in chunks:
            slots += [c.request.slot] * c.length
            starts += range(c.start, c.start + c.length)
            ids += c.work.payload.ids[c.offset : c.offset + c.length]
            last.append(len(ids) - 1)
        if eager or self._graphs is None or all(c.work.decode for c in chunks):
            logits = self._rows_logits(slots, starts, ids, eager)
        else:
            size = self.max_rows
            pieces = [
                self._rows_logits(slots[n : n + size], starts[n : n + size], ids[n : n + size])
                for n in range(0, len(ids), size)
            ]
            logits = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        index = torch.tensor(last, device=self.device)
        picks = self._picks(logits.index_select(0, index), chunks)
        fed: list[Fed] = []
        given = torch.tensor(ids, device=self.device)
        for chunk, token, end in zip(chunks, picks, last, strict=True):
            rows_of = None
            if chunk.work.payload.rows:  # text: the talker's rows are the input embeddings
                first = end + 1 - chunk.length
                rows_of = self._embedding(given[first : end + 1])
            fed.append(Fed(rows_of, token))
        return fed

    def _rows_logits(
        self, slots: list[int], starts: list[int], ids: list[int], eager: bool = False
    ) -> torch.Tensor:
        """Logits [n, vocab] of single-position rows: replayed from the graph of their
        (row bucket, span), eager past the largest graph (counted) or when asked."""
        count = len(ids)
        rows = bucket(count, row_buckets(self.max_rows)) or count
        span = span_for(max(starts) + 1, self.cache.max_len)
        key = (rows, span)
        pad = rows - count
        slots, starts = slots + [self.cache.scratch] * pad, starts + [0] * pad
        given = [torch.tensor(v, device=self.device) for v in (slots, starts, ids + [0] * pad)]
        if eager or self._graphs is None:
            (logits,) = self._decode(span, *given)
        elif count > self.max_rows:
            (logits,) = self._graphs.run_eager(functools.partial(self._decode, span), *given)
        else:
            static = self._static_inputs(key)
            for buffer, value in zip(static, given, strict=True):
                buffer.copy_(value)
            (logits,) = self._graphs(key, functools.partial(self._decode, span), *static)
        return logits[:count]

    def _static_inputs(self, key: tuple[int, int]) -> list[torch.Tensor]:
        static = self._decode_inputs.get(key)
        if static is None:
            rows = key[0]
            scratch = torch.full((rows,), self.cache.scratch, dtype=torch.long)
            zeros = torch.zeros(rows, dtype=torch.long)
            static = [t.to(self.device) for t in (scratch, zeros, zeros.clone())]
            self._decode_inputs[key] = static
        return static

    def _decode(
        self, span: int, slots: torch.Tensor, starts: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The decode-only step: logits [B, vocab] of each row's next token (capturable:
        a function of its input tensors, nothing read back to the host)."""
        step = self.cache.decode_step(slots, starts, span)
        layers = self._layers.active() if self._layers is not None else contextlib.nullcontext()
        with step.active(self._configs), layers:
            out = self._thinker.model(
                input_ids=ids[None],
                position_ids=starts[None],
                attention_mask=step.mask,
                past_key_values=step,
                use_cache=True,
            )
        return (self._thinker.lm_head(out.last_hidden_state[0]),)

    def _audio_rows(self, chunks: list[ThinkerChunk]) -> torch.Tensor | None:
        """The audio embeddings of the step's AUDIO_PADs, in token order."""
        pad = self.vocabulary.ids.audio_pad
        parts = []
        for chunk in chunks:
            feeding = chunk.work.payload
            if feeding.audio is None:
                continue
            before = feeding.ids[: chunk.offset].count(pad)
            inside = feeding.ids[chunk.offset : chunk.offset + chunk.length].count(pad)
            parts.append(feeding.audio[before : before + inside])
        return torch.cat(parts) if parts else None

    def _picks(self, logits: torch.Tensor, chunks: list[ThinkerChunk]) -> list[Token | None]:
        """The token of each chunk that ends a picking work: the greedy ones in one pass,
        the sampled ones in another (each with its own generator), all read back to the
        host at once."""
        wanted = [row for row, c in enumerate(chunks) if c.last and c.work.payload.pick is not None]
        picks: list[Token | None] = [None] * len(chunks)
        if not wanted:
            return picks
        choices: list[Pick] = []
        for row in wanted:
            choice = chunks[row].work.payload.pick
            assert choice is not None
            choices.append(choice)
        device = logits.device
        index = torch.tensor(wanted, device=device)
        ends = torch.tensor([choice.allow_end for choice in choices], device=device)
        rows = logits.index_select(0, index).float()
        allowed = self._allow[ends.long()]
        chosen = (rows + allowed).argmax(dim=-1)
        sampled = [n for n, choice in enumerate(choices) if choice.sampling.temperature > 0]
        if sampled:
            at = torch.tensor(sampled, device=device)
            temperatures = torch.tensor(
                [choices[n].sampling.temperature for n in sampled], device=device
            )
            drawn = draw(
                rows.index_select(0, at),
                allowed.index_select(0, at),
                temperatures,
                [choices[n].sampling.generator for n in sampled],
            )
            chosen = chosen.index_copy(0, at, drawn)
        tokens = chosen.tolist()
        embeds = self._embedding(chosen)
        for n, row in enumerate(wanted):
            picks[row] = (tokens[n], embeds[n : n + 1])
        return picks

    def _encode(self, mel: torch.Tensor) -> torch.Tensor:
        return stepping.encode_audio(self._thinker, mel)


def _feature_extractor(path: Path) -> WhisperFeatureExtractor:
    """The release's mel front end, from its ``preprocessor_config.json``.

    Read and checked first: ``from_pretrained`` would report a broken file without
    naming it, and a missing one by looking for it on the Hub.
    """
    file = path / _PREPROCESSOR
    read_json(file, remedy=layout.remedy(file))
    try:
        with configs.quiet_transformers():
            extractor = WhisperFeatureExtractor.from_pretrained(str(path), local_files_only=True)
    except Exception as error:  # the file parsed, yet is no Whisper extractor's config
        problem = f"is no WhisperFeatureExtractor config ({error})"
        raise ModelFileError(file, problem, layout.remedy(file)) from error
    assert isinstance(extractor, WhisperFeatureExtractor)
    return extractor
