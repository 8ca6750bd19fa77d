"""``ThinkerEngine``: tiny-omni's thinker as a streaming, resumable torch engine.

The entry stage: it answers the user's text and audio with text tokens plus what the
talker needs to speak them. Input is prefilled into the session's KV cache *while it
arrives* (one forward per text chunk), so when the user's turn ends only its tail is
left to compute and the first token comes quickly.

Audio is the exception: a run of consecutive audio chunks is buffered and encoded as one
clip when the run ends (a text chunk follows, or the segment's input ends). Encoding per
chunk would not be exact: Whisper's log-mel is normalised by the clip's maximum and the
STFT pads at clip edges, and the audio encoder attends bidirectionally over 8 s windows.

A segment's prompt (HF's chat template; roles are the ``USER``/``ASSISTANT`` special
ids, as HF's talker finds the turns it conditions on by them)::

    [previous turn's tail] <|im_start|> USER \\n (text | <|audio_start|> PAD*n <|audio_end|>)*
    <|im_end|> \\n <|im_start|> ASSISTANT \\n  -> generated tokens

The previous turn's tail is its unfed last token (when it stopped at ``max_new_tokens``)
and ``<|im_end|> \\n``, so the cached conversation stays well-formed across segments.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, NamedTuple, cast

import numpy as np
import torch
from pydantic import Field

from omni_actors.actors.engine import Fields, Rule
from omni_actors.actors.tiny_omni import configs, stepping, weights
from omni_actors.actors.tiny_omni.configs import Tokens
from omni_actors.actors.tiny_omni.family import TINY_OMNI
from omni_actors.actors.tiny_omni.hf import (
    DynamicCache,
    PreTrainedConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)
from omni_actors.actors.torch_engine import AbortSignal, TorchEngine, stage_dir
from omni_actors.model_family import WeightsArgs

__all__ = ["ThinkerArgs", "ThinkerEngine"]

NEWLINE: Final = 10
_MIN_AUDIO: Final = 400  # one 25 ms STFT window; shorter runs are dropped (nothing to
# hear, and the mel front end's reflect padding fails on them)
PRINTABLE: Final = range(32, 127)
"""Byte ids the thinker may emit: random weights would otherwise emit control bytes and
special tokens, which no text consumer downstream could show."""
ASSISTANT_OPENING: Final = (Tokens.IM_START, Tokens.ASSISTANT, NEWLINE)


class ThinkerArgs(WeightsArgs):
    """The thinker's arguments: ``seed`` and ``cache_dir`` locate its weights.

    Attributes:
        max_new_tokens: a reply's most tokens.
        min_new_tokens: ``<|im_end|>`` is masked until that many tokens exist; capped
            at ``max_new_tokens`` (setting only a small maximum means "at most that
            many", not a conflict).
    """

    max_new_tokens: int = Field(48, ge=1)
    min_new_tokens: int = Field(8, ge=0)


class _Prefilled(NamedTuple):
    """What one prefill forward returns to the event loop."""

    rows: torch.Tensor
    """[L, H] the talker's thinker-space input per position (see ``_prefill``)."""
    placeholders: torch.Tensor
    """[L] bool, True at AUDIO_PAD positions (whose row is ``accept_hidden``)."""
    first: tuple[int, torch.Tensor] | None
    """The first generated token and its embedding, when the prefill ends the prompt."""


@dataclass
class _Conversation:
    """One session's thinker state, kept across segments until release or abort."""

    cache: DynamicCache
    position: int = 0
    """Tokens in ``cache``: the next forward starts here."""
    carry: list[int] = field(default_factory=list)
    """Tokens that close the previous assistant turn, fed before the next user turn."""
    signal: AbortSignal | None = None
    """Set while a segment is generating."""


@dataclass
class _Turn:
    """The not-yet-prefilled part of a segment's user turn, and its talker rows so far."""

    ids: list[int]
    skip: int
    """Leading rows of the next prefill that belong to the previous turn (the carry)."""
    audio: list[np.ndarray[Any, np.dtype[np.float32]]] = field(default_factory=list)
    """The buffered audio run, encoded as one clip at the next prefill."""
    audio_at: int = 0
    """Where in ``ids`` the audio run goes (the ids pending when it started)."""
    rows: list[torch.Tensor] = field(default_factory=list)  # see _Prefilled
    placeholders: list[torch.Tensor] = field(default_factory=list)


class ThinkerEngine(TorchEngine):
    """Greedy byte-level text generation with streaming prefill (see the module docstring).

    Outputs, one per generated token: ``token_ids`` [1] int64, ``text`` (that byte as a
    one-character str) and ``embed`` [1, H] float32 (the token's input embedding: the
    talker's text input for it). Committed user turns come as ``user`` [n, H] float32
    and ``user_mask`` [n] bool rows (``concat``); the first token of a response also
    carries ``opening`` [3, H] and ``tts`` [3, H] float32 (see :meth:`generate`).

    Args:
        args: see :class:`ThinkerArgs`.

    Raises:
        ModelNotPreparedError: the weights are not prepared.
    """

    kind: ClassVar[str] = "tiny-omni.thinker"
    Args: ClassVar[type[ThinkerArgs]] = ThinkerArgs
    inputs: ClassVar[dict[str, Rule]] = {"text": "concat", "audio": "concat"}
    outputs: ClassVar[dict[str, Rule]] = {
        "token_ids": "concat",
        "text": "concat",
        "embed": "concat",
        # Rows of committed user turns, sent as each turn is committed.
        "user": "concat",
        "user_mask": "concat",
        # Sent once per response, with its first token.
        "opening": "replace",
        "tts": "replace",
    }
    streams_input: ClassVar[bool] = True

    def __init__(self, args: ThinkerArgs) -> None:
        self.max_new_tokens = args.max_new_tokens
        self.min_new_tokens = min(args.min_new_tokens, args.max_new_tokens)
        super().__init__(stage_dir(TINY_OMNI.name, args, "thinker"), "thinker")
        self._sessions: dict[str, _Conversation] = {}

    def _load(self, path: Path) -> None:
        thinker = weights.load(path)
        assert isinstance(thinker, Qwen3OmniMoeThinkerForConditionalGeneration)
        self._thinker = thinker
        # The talker's conditioning layer is a talker setting; the thinker stage's own
        # config does not have it, the composite config one level up does.
        composite = json.loads((path.parent / "config.json").read_text())
        self._accept_layer = int(composite["talker_config"]["accept_hidden_layer"])
        self._text_config = cast(PreTrainedConfig, thinker.config.text_config)
        self._audio_window = int(cast(PreTrainedConfig, thinker.config.audio_config).n_window)
        # Annotated from transformers 5.23 on, untyped before: the ignore serves the
        # older releases of the supported range and is unused on newer ones.
        self._embedding = thinker.get_input_embeddings()  # type: ignore[no-untyped-call,unused-ignore]
        self._extractor = configs.audio_feature_extractor()
        vocab = self._text_config.vocab_size
        self._allow_text = torch.full((vocab,), float("-inf"))
        self._allow_text[list(PRINTABLE)] = 0.0
        self._allow_end = self._allow_text.clone()
        self._allow_end[Tokens.IM_END] = 0.0
        # No graph: weights.load turned gradients off.
        self._tts = self._embedding(torch.tensor([Tokens.TTS_BOS, Tokens.TTS_EOS, Tokens.TTS_PAD]))

    # -- introspection -------------------------------------------------------------------

    @property
    def active_sessions(self) -> set[str]:
        """Sessions holding thinker state (generating, or between segments)."""
        return set(self._sessions)

    @property
    def generating(self) -> set[str]:
        """Sessions with a running ``generate``."""
        return {s for s, c in self._sessions.items() if c.signal is not None}

    def cached_tokens(self, session: str) -> int:
        """Positions in ``session``'s KV cache (0 when it has no state)."""
        conversation = self._sessions.get(session)
        return 0 if conversation is None else conversation.position

    # -- the engine protocol --------------------------------------------------------------

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """Prefill the segment's input as it arrives, then decode one token per output.

        Input fields per chunk: ``text`` (str) and/or ``audio`` (float32 1-D, 16 kHz
        mono); in a chunk with both, the audio comes first. ``user`` [n, H] holds, per
        position of each committed user turn ``<|im_start|>user … <|im_end|>\\n``, the
        thinker input embedding, or at audio placeholders (where ``user_mask`` is True)
        the hidden state at ``accept_hidden_layer`` — what ``stepping.talker_user_part``
        selects from. ``opening`` [3, H] holds the embeddings of ``<|im_start|>assistant
        \\n`` and ``tts`` [3, H] those of TTS_BOS, TTS_EOS and TTS_PAD.

        Raises:
            ValueError: the session is already generating a segment.
        """
        conversation = self._sessions.get(session)
        if conversation is None:
            cache = DynamicCache(config=self._text_config)
            conversation = self._sessions[session] = _Conversation(cache)
        if conversation.signal is not None:
            raise ValueError(f"session {session!r} is already generating")
        signal = conversation.signal = AbortSignal()
        opening = [*conversation.carry, Tokens.IM_START, Tokens.USER, NEWLINE]
        turn = _Turn(opening, skip=len(conversation.carry))
        conversation.carry = []
        step: asyncio.Future[tuple[int, torch.Tensor]] | None = None
        clean = False
        try:
            while (fields := await signal.next_input(inputs)) is not None:
                await self._take(conversation, turn, fields)
                if signal.aborted:
                    return
            if signal.aborted:
                return
            turn.ids += [Tokens.IM_END, NEWLINE, *ASSISTANT_OPENING]
            last = await self._prefill_pending(conversation, turn, self.min_new_tokens == 0)
            assert last.first is not None
            token, embed = last.first
            produced = 0
            while token != Tokens.IM_END and not signal.aborted:
                produced += 1
                out: dict[str, torch.Tensor | str] = {
                    "token_ids": torch.tensor([token]),
                    "text": chr(token),
                    "embed": embed,
                }
                if produced == 1:
                    rows = torch.cat(turn.rows)
                    out["user"] = rows[: -len(ASSISTANT_OPENING)]
                    out["user_mask"] = torch.cat(turn.placeholders)[: -len(ASSISTANT_OPENING)]
                    out["opening"] = rows[-len(ASSISTANT_OPENING) :]
                    out["tts"] = self._tts
                if produced < self.max_new_tokens:
                    # Start the next step before handing this token out: the model thread
                    # works while the stage routes the output.
                    allow_end = produced >= self.min_new_tokens
                    step = asyncio.ensure_future(
                        self.call(self._decode, conversation, token, allow_end)
                    )
                yield out
                if step is None:
                    break
                token, embed = await step
                step = None
            if signal.aborted:
                return
            unfed = [token] if token != Tokens.IM_END else []
            conversation.carry = [*unfed, Tokens.IM_END, NEWLINE]
            clean = True
        finally:
            if step is not None and not step.done():
                step.cancel()
            conversation.signal = None
            if not clean and self._sessions.get(session) is conversation:
                # A segment cut short leaves a half-written turn (maybe a forward still
                # running on the cache): the conversation cannot continue.
                del self._sessions[session]

    async def abort(self, session: str) -> None:
        """Drop ``session``'s state; a running ``generate`` ends at its next step."""
        conversation = self._sessions.pop(session, None)
        if conversation is not None and conversation.signal is not None:
            conversation.signal.abort()

    async def release(self, session: str) -> None:
        """The conversation is over: drop its KV cache."""
        await self.abort(session)

    async def stop(self) -> None:
        """Abort every session, then end the model thread."""
        for session in list(self._sessions):
            await self.abort(session)
        await super().stop()

    # -- prefill ------------------------------------------------------------------------

    async def _take(self, conversation: _Conversation, turn: _Turn, fields: Fields) -> None:
        """Add one input chunk to the user turn, prefilling what can be prefilled now."""
        audio = fields.get("audio")
        if isinstance(audio, torch.Tensor) and audio.numel():
            if not turn.audio:
                turn.audio_at = len(turn.ids)
            turn.audio.append(audio.detach().to(torch.float32).reshape(-1).numpy().copy())
        text = fields.get("text")
        if isinstance(text, str) and text:
            turn.ids += configs.encode_text(text)
            await self._prefill_pending(conversation, turn)

    async def _prefill_pending(
        self, conversation: _Conversation, turn: _Turn, allow_end: bool | None = None
    ) -> _Prefilled:
        """Prefill the turn's pending ids and audio run, keeping the talker rows that
        belong to this segment's turn; pick the first token unless ``allow_end`` is None."""
        audio = np.concatenate(turn.audio) if turn.audio else None
        done = await self.call(
            self._prefill, conversation, turn.ids, turn.audio_at, audio, allow_end
        )
        turn.rows.append(done.rows[turn.skip :])
        turn.placeholders.append(done.placeholders[turn.skip :])
        turn.ids, turn.audio, turn.skip = [], [], 0
        return done

    @torch.no_grad()
    def _prefill(
        self,
        conversation: _Conversation,
        ids: list[int],
        audio_at: int,
        audio: np.ndarray[Any, np.dtype[np.float32]] | None,
        allow_end: bool | None,
    ) -> _Prefilled:
        """Model thread: one forward over ``ids`` with ``audio`` spliced in at ``audio_at``.

        Rows: the input embedding per position, the ``accept_hidden_layer`` state at
        AUDIO_PAD positions (``stepping.talker_user_part`` selects between the two by the
        placeholder mask, so one tensor carries what it needs).
        """
        features: dict[str, torch.Tensor] = {}
        if audio is not None and audio.size >= _MIN_AUDIO:
            extracted = self._extractor(
                audio,
                sampling_rate=configs.AUDIO_SAMPLE_RATE,
                padding="longest",
                truncation=False,
                return_attention_mask=True,
                return_tensors="pt",
            )
            mask = extracted["attention_mask"]
            n_audio = stepping.audio_token_count(int(mask.sum()), self._audio_window)
            if n_audio > 0:
                features = {"input_features": extracted["input_features"]}
                features["feature_attention_mask"] = mask
                clip = [Tokens.AUDIO_START, *[Tokens.AUDIO_PAD] * n_audio, Tokens.AUDIO_END]
                ids = [*ids[:audio_at], *clip, *ids[audio_at:]]
        input_ids = torch.tensor([ids])
        step = stepping.thinker_forward(
            self._thinker,
            input_ids,
            conversation.cache,
            conversation.position,
            accept_layer=self._accept_layer,
            **features,
        )
        conversation.position += len(ids)
        placeholders = input_ids[0] == Tokens.AUDIO_PAD
        rows = torch.where(placeholders[:, None], step.accept_hidden[0], step.embeds[0])
        first = None if allow_end is None else self._pick(step.logits[0, -1], allow_end)
        return _Prefilled(rows, placeholders, first)

    # -- decode -------------------------------------------------------------------------

    @torch.no_grad()
    def _pick(self, logits: torch.Tensor, allow_end: bool) -> tuple[int, torch.Tensor]:
        """Model thread: the greedy printable token (or im_end) and its [1, H] embedding."""
        allowed = self._allow_end if allow_end else self._allow_text
        token = int((logits + allowed).argmax())
        return token, self._embedding(torch.tensor([token]))

    @torch.no_grad()
    def _decode(
        self, conversation: _Conversation, token: int, allow_end: bool
    ) -> tuple[int, torch.Tensor]:
        """Model thread: feed ``token``, pick the next one."""
        step = stepping.thinker_forward(
            self._thinker,
            torch.tensor([[token]]),
            conversation.cache,
            conversation.position,
            accept_layer=self._accept_layer,
        )
        conversation.position += 1
        return self._pick(step.logits[0, -1], allow_end)
