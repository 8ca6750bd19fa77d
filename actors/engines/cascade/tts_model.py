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

On a GPU a frame is bound by kernel launches (one backbone step and ``codebooks - 1``
depth-decoder steps, each a few dozen small kernels), so it is replayed from CUDA graphs
with the machinery the Qwen3-Omni thinker and talker use
(:class:`~omni_actors.actors.engines.qwen3_omni.graphs.ShapeGraphs`): a step of frame
rows alone is one graph per (row bucket, span), holding the frames' embedding, the
backbone's decode step over the slot cache, codebook 0's pick and the depth decoder's
steps; padding rows step the cache's scratch slot. A step that mixes prefills with
frames runs its backbone eagerly and replays its depth decoder per batch bucket
(:class:`~omni_actors.actors.engines.qwen3_omni.code_predictor_graph.GraphedCodePredictor`,
as the talker's mixed steps do). Each graph is checked bit for bit against the eager
step when it is captured, else that shape stays eager.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni_actors.actors.engines.qwen3_omni.code_predictor_graph import (
    CodeFrame,
    GraphedCodePredictor,
)
from omni_actors.actors.engines.qwen3_omni.graphs import Capture, ShapeGraphs, bucket
from omni_actors.actors.engines.qwen3_omni.slot_cache import (
    Segment,
    SlotCache,
    row_buckets,
    span_for,
)
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
        max_rows: the most frame rows one step runs (its largest graph); None: ``slots``.
        graphs: replay frame-only steps, and the depth decoder of the others, from CUDA
            graphs (CUDA only).
        warm: capture every graph at load.
        capture: how graphs are captured (tests pass a stand-in on a machine without a GPU).

    Attributes:
        tokenizer: the release's text tokenizer.
        codebooks: codes per frame.
        eos: the code that, in every codebook but the last, ends an utterance.
    """

    def __init__(
        self,
        path: Path,
        device: torch.device,
        *,
        slots: int,
        max_context: int,
        max_rows: int | None = None,
        graphs: bool = False,
        warm: bool = False,
        capture: Capture | None = None,
    ) -> None:
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
        self._dtype = dtype
        self.max_rows = min(max_rows or slots, slots)
        if graphs and device.type != "cuda" and capture is None:
            raise ValueError(f"graphs need a CUDA device, not {device}")
        self._graphs: ShapeGraphs[tuple[int, int]] | None = None
        # Mixed steps' depth decoder: replayed per row bucket where graphs are on.
        self._depth_frame: CodeFrame = self._depth_codes
        if graphs:
            self._graphs = ShapeGraphs("csm frame", capture=capture)
            self._depth_frame = GraphedCodePredictor(
                self._depth_codes,
                self._depth_zeros,
                buckets=row_buckets(self.max_rows),
                capture=capture,
                name="csm depth decoder",
            )
        self._frame_inputs: dict[tuple[int, int], list[torch.Tensor]] = {}
        if warm:
            self.warm()

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

    def frame_keys(self) -> list[tuple[int, int]]:
        """Every (row bucket, span) a frame-only step may need, smallest first."""
        return self.cache.graph_keys(self.max_rows)

    @property
    def graphed(self) -> list[tuple[int, int]]:
        """(row bucket, span) pairs whose frame-only step replays from a graph."""
        return sorted(self._graphs.graphed) if self._graphs is not None else []

    @property
    def depth_graphed(self) -> list[int]:
        """Row buckets whose mixed steps' depth decoder replays from a graph."""
        frame = self._depth_frame
        return frame.graphed if isinstance(frame, GraphedCodePredictor) else []

    @property
    def eager_steps(self) -> int | None:
        """Steps run eager for want of a graph: frame-only steps (more rows than
        ``max_rows``, a shape whose graph failed or differed; not ``step(eager=True)``)
        and the depth decoder of mixed steps; None without graphs."""
        depth = self._depth_frame if isinstance(self._depth_frame, GraphedCodePredictor) else None
        counts = [part.eager_steps for part in (self._graphs, depth) if part is not None]
        return sum(counts) if counts else None

    @torch.no_grad()
    def warm(self) -> list[tuple[int, int]]:
        """Capture every graph now (at load, while nothing else runs on the device): the
        frame-only steps step the scratch slot only."""
        if self._graphs is None:
            return []
        for key in self.frame_keys():
            static = self._static_inputs(key)
            self._graphs.capture(key, functools.partial(self._frame_step, key[1]), *static)
        if isinstance(self._depth_frame, GraphedCodePredictor):
            for rows in row_buckets(self.max_rows):
                self._depth_frame.warm(rows)
        return self.graphed

    @torch.no_grad()
    def step(self, chunks: list[SpeechChunk], *, eager: bool = False) -> list[torch.Tensor | None]:
        """One backbone forward over every chunk, then the depth decoder over the rows
        that pick; each picking chunk's frame [codebooks] (None for the others).
        ``eager`` runs a frame-only step without its graph (to compare the two)."""
        if all(_frame_row(c) for c in chunks):
            return self._frames_step(chunks, eager)
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
        codes = self._depth_frame(hidden, first)[0].cpu()
        for row, n in enumerate(wanted):
            frames[n] = codes[row]
        return frames

    def _frames_step(self, chunks: list[SpeechChunk], eager: bool) -> list[torch.Tensor | None]:
        """Frame rows alone: a graph per (row bucket, span) where there is one."""
        count = len(chunks)
        graphs = None if eager or count > self.max_rows else self._graphs
        # Padded to its row bucket for a graph only: eagerly, a padding row is waste.
        rows = (bucket(count, row_buckets(self.max_rows)) or count) if graphs else count
        span = span_for(max(c.start for c in chunks) + 1, self.cache.max_len)
        pad = rows - count
        slots = [c.request.slot for c in chunks] + [self.cache.scratch] * pad
        starts = [c.start for c in chunks] + [0] * pad
        frames = torch.cat([_frame(c) for c in chunks]).to(torch.long)
        if pad:  # code 0 of every codebook: a valid frame, written to the scratch slot
            frames = torch.cat((frames, frames.new_zeros(pad, frames.shape[1])))
        given = [torch.tensor(v, device=self.device) for v in (slots, starts)]
        given.append(frames.to(self.device))
        key = (rows, span)
        if graphs is None:
            step = functools.partial(self._frame_step, span)
            if eager or self._graphs is None:
                (codes,) = step(*given)
            else:  # more rows than the largest graph: counted
                (codes,) = self._graphs.run_eager(step, *given)
        else:
            static = self._static_inputs(key)
            for buffer, value in zip(static, given, strict=True):
                buffer.copy_(value)
            (codes,) = graphs(key, functools.partial(self._frame_step, span), *static)
        return list(codes[:count].cpu())

    def _static_inputs(self, key: tuple[int, int]) -> list[torch.Tensor]:
        static = self._frame_inputs.get(key)
        if static is None:
            rows = key[0]
            with torch.device(self.device):
                static = [
                    torch.full((rows,), self.cache.scratch, dtype=torch.long),
                    torch.zeros(rows, dtype=torch.long),
                    torch.zeros(rows, self.codebooks, dtype=torch.long),
                ]
            self._frame_inputs[key] = static
        return static

    def _frame_step(
        self, span: int, slots: torch.Tensor, starts: torch.Tensor, frames: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The frame-only step: ``(codes [B, codebooks],)``, the frame after each row's
        ``frames`` [B, codebooks]. Capturable: a function of its input tensors, nothing
        read back to the host."""
        model = self._model
        embeds = model.backbone_model.embed_tokens(frames[None])  # [1, B, H]
        step = self.cache.decode_step(slots, starts, span)
        with step.active(self._configs):
            out = model.backbone_model(
                inputs_embeds=embeds,
                position_ids=starts[None],
                attention_mask=step.mask,
                past_key_values=step,
                use_cache=True,
            )
        hidden = out.last_hidden_state[0]
        return self._depth_codes(hidden, self._pick(model.lm_head(hidden)))

    def _depth_codes(self, hidden: torch.Tensor, first: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self._depth(hidden, first),)

    def _depth_zeros(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A depth-decoder batch of ``rows`` zeros (its graphs' warm-up inputs)."""
        width = int(self._model.config.hidden_size)
        with torch.device(self.device):
            hidden = torch.zeros(rows, width, dtype=self._dtype)
            return hidden, torch.zeros(rows, dtype=torch.long)

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The greedy code of each row of ``logits`` [B, vocab], among the codec's."""
        return logits[:, : self._codes].float().argmax(dim=-1)

    def _depth(self, hidden: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """The depth decoder's greedy codes after codebook 0, batched: [B, codebooks].

        Capturable: after the first forward, each code goes in embedded as CSM embeds
        it (codebook ``k`` at offset ``k * vocab``), since given as ids transformers
        reads a position back to the host to warn about a missing hidden state."""
        depth = self._model.depth_decoder
        embed = depth.model.embed_tokens
        vocab = int(depth.config.vocab_size)
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
        for book in range(1, self.codebooks):
            code = self._pick(out.logits[:, -1])
            codes.append(code)
            if book == self.codebooks - 1:
                break
            out = depth(
                inputs_embeds=embed(code[:, None] + book * vocab),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return torch.stack(codes, dim=1)


def _frame_row(chunk: SpeechChunk) -> bool:
    """Whether ``chunk`` is a decode row of one frame that picks the next."""
    speech = chunk.work.payload
    return chunk.work.decode and speech.pick and not speech.text and speech.frames is not None


def _frame(chunk: SpeechChunk) -> torch.Tensor:
    frames = chunk.work.payload.frames
    assert frames is not None, "a frame row feeds a frame"
    return frames
