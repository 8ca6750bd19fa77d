"""``ThinkerEngine``: tiny-omni's thinker as a conversation engine.

The entry stage: it answers the user's text and audio with text tokens plus what the
talker needs to speak them. Each ``generate`` call is one response of a conversation
whose KV cache the engine keeps per session (:class:`~.conversation.Conversation`).
Input is prefilled *while it arrives* (:class:`~.user_turn.UserTurn`: text per chunk,
audio per encoder window), so when the input ends only its tail is left to compute and
the first token comes quickly, however long the user spoke.

The input is user turns and turn marks (``omni_actors.actors.engine``): ``commit``
closes the user turn and sends its rows to the talker; ``clear`` crops the cache back
to the last commit; ``truncate`` cuts the last reply to what the user heard. The end of
the input commits what is pending, then the reply opens (``<|im_start|> ASSISTANT \\n``)
and decodes; with no input at all, it replies to the conversation so far.

A reply the stage closes (``aclose``, a barge-in) stays in the conversation as far as
it was yielded; a response that fails is rolled back to where it started; an abort
drops the session.

Sampling: greedy unless the response asks for a ``temperature`` > 0; then each token is
drawn from the softmax of the allowed tokens' logits at that temperature, with the
session's own ``torch.Generator``, seeded from the engine's ``seed`` and the session key
(BLAKE2b, not Python's salted ``hash``): the same pipeline seed and session key draw the
same reply on every run, and sessions never share a random stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar, Final, Literal, NamedTuple, cast

import torch
from pydantic import Field

from omni_actors.actors.engine import (
    KEPT_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
    Rule,
    response_options,
)
from omni_actors.actors.tiny_omni import configs, stepping, weights
from omni_actors.actors.tiny_omni.audio_stream import AudioClip
from omni_actors.actors.tiny_omni.configs import Tokens
from omni_actors.actors.tiny_omni.conversation import (
    CLOSE_TURN,
    NEWLINE,
    Checkpoint,
    Conversation,
    Reply,
)
from omni_actors.actors.tiny_omni.family import TINY_OMNI
from omni_actors.actors.tiny_omni.hf import (
    DynamicCache,
    PreTrainedConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)
from omni_actors.actors.tiny_omni.log_mel import LogMel
from omni_actors.actors.tiny_omni.user_turn import Feed, UserTurn
from omni_actors.actors.torch_engine import AbortSignal, TorchEngine, stage_dir
from omni_actors.model_family import WeightsArgs

__all__ = ["ASSISTANT_OPENING", "NEWLINE", "ThinkerArgs", "ThinkerEngine"]

PRINTABLE: Final = range(32, 127)
"""Byte ids the thinker may emit: random weights would otherwise emit control bytes and
special tokens, which no text consumer downstream could show."""
ASSISTANT_OPENING: Final = (Tokens.IM_START, Tokens.ASSISTANT, NEWLINE)


class ThinkerArgs(WeightsArgs):
    """The thinker's arguments: ``seed`` and ``cache_dir`` locate its weights.

    Attributes:
        max_new_tokens: a reply's most tokens (a response's ``max_tokens`` overrides it).
        min_new_tokens: ``<|im_end|>`` is masked until that many tokens exist; capped
            at the reply's maximum (setting only a small maximum means "at most that
            many", not a conflict).
    """

    max_new_tokens: int = Field(48, ge=1)
    min_new_tokens: int = Field(8, ge=0)


class _Sampling(NamedTuple):
    """How a response picks its tokens."""

    max_tokens: int
    min_tokens: int
    temperature: float
    """0: greedy."""
    generator: torch.Generator | None


Token = tuple[int, torch.Tensor]
"""A picked token and its [1, H] input embedding."""

_Outcome = Literal["done", "cancelled", "failed", "dropped"]


class ThinkerEngine(TorchEngine):
    """Byte-level text replies with streaming prefill (see the module docstring).

    Outputs, one per generated token: ``token_ids`` [1] int64, ``text`` (that byte as a
    one-character str) and ``embed`` [1, H] float32 (the token's input embedding: the
    talker's text input for it); the first token of a reply also carries ``opening``
    [3, H] (the embeddings of ``<|im_start|> ASSISTANT \\n``) and ``tts`` [3, H] float32
    (those of TTS_BOS, TTS_EOS, TTS_PAD). Each committed user turn comes, as soon as it
    is committed, as an output without a token: ``user`` [n, H] float32, per position of
    ``<|im_start|> USER \\n … <|im_end|> \\n`` the thinker's input embedding, or at audio
    placeholders (where ``user_mask`` [n] bool is True) the hidden state at
    ``accept_hidden_layer``: what ``stepping.talker_user_part`` selects from.

    Args:
        args: see :class:`ThinkerArgs`.

    Raises:
        ModelNotPreparedError: the weights are not prepared.
    """

    kind: ClassVar[str] = "tiny-omni.thinker"
    Args: ClassVar[type[ThinkerArgs]] = ThinkerArgs
    inputs: ClassVar[dict[str, Rule]] = {"text": "concat", "audio": "concat", TURN_FIELD: "concat"}
    outputs: ClassVar[dict[str, Rule]] = {
        "token_ids": "concat",
        "text": "concat",
        "embed": "concat",
        # Rows of committed user turns, sent as each turn is committed.
        "user": "concat",
        "user_mask": "concat",
        # Sent once per reply, with its first token.
        "opening": "replace",
        "tts": "replace",
    }
    streams_input: ClassVar[bool] = True

    def __init__(self, args: ThinkerArgs) -> None:
        self.max_new_tokens = args.max_new_tokens
        self.min_new_tokens = min(args.min_new_tokens, args.max_new_tokens)
        self.seed = args.seed
        super().__init__(stage_dir(TINY_OMNI.name, args, "thinker"), "thinker")
        self._sessions: dict[str, Conversation] = {}

    def _load(self, path: Path) -> None:
        thinker = weights.load(path)
        assert isinstance(thinker, Qwen3OmniMoeThinkerForConditionalGeneration)
        self._thinker = thinker
        # The talker's conditioning layer is a talker setting; the thinker stage's own
        # config does not have it, the composite config one level up does.
        composite = json.loads((path.parent / "config.json").read_text())
        self._accept_layer = int(composite["talker_config"]["accept_hidden_layer"])
        self._text_config = cast(PreTrainedConfig, thinker.config.text_config)
        audio = cast(PreTrainedConfig, thinker.config.audio_config)
        self._n_window, self._n_window_infer = int(audio.n_window), int(audio.n_window_infer)
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
        self._opening = self._embedding(torch.tensor(ASSISTANT_OPENING))

    # -- introspection -------------------------------------------------------------------

    @property
    def active_sessions(self) -> set[str]:
        """Sessions holding thinker state (generating, or between responses)."""
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
        """One response: prefill its input as it arrives, then decode one token per output.

        Input fields per chunk: ``text`` (str) and/or ``audio`` (float32 1-D, 16 kHz
        mono; in a chunk with both, the audio comes first), or a turn mark. Outputs: see
        the class docstring.

        Raises:
            ValueError: the session is already generating, a mark is malformed, a
                truncation has no reply to cut, or the options are out of range.
        """
        conversation = self._sessions.get(session)
        if conversation is None:
            cache = DynamicCache(config=self._text_config)
            conversation = self._sessions[session] = Conversation(cache)
        if conversation.signal is not None:
            raise ValueError(f"session {session!r} is already generating")
        signal = conversation.signal = AbortSignal()
        start = committed = conversation.checkpoint()
        turn = UserTurn()
        step: asyncio.Future[Token] | None = None
        outcome: _Outcome = "dropped"
        try:
            while (fields := await signal.next_input(inputs)) is not None:
                mark = fields.get(TURN_FIELD)
                if mark == "commit":
                    rows = await self._commit(conversation, turn)
                    turn, committed = UserTurn(), conversation.checkpoint()
                    if rows is not None:
                        yield rows
                elif mark == "clear":
                    conversation.restore(committed)
                    turn = UserTurn()
                elif mark == "truncate":
                    await self._truncate(conversation, turn, _kept(fields))
                    committed = conversation.checkpoint()
                elif mark is not None:
                    raise ValueError(f"unknown turn mark {mark!r}: commit, clear or truncate")
                else:
                    await self._take(conversation, turn, fields)
                if signal.aborted:
                    return
            if signal.aborted:
                return
            sampling = self._sampling(session, conversation, response_options(inputs))
            rows = await self._commit(conversation, turn)
            if rows is not None:
                yield rows
            token, embed = await self.call(self._open_reply, conversation, sampling)
            reply = conversation.reply = Reply(conversation.position, (), 0)
            conversation.turns_since_reply = 0
            while token != Tokens.IM_END and not signal.aborted:
                out: dict[str, torch.Tensor | str] = {
                    "token_ids": torch.tensor([token]),
                    "text": chr(token),
                    "embed": embed,
                }
                if not reply.tokens:
                    out["opening"] = self._opening
                    out["tts"] = self._tts
                reply = conversation.reply = Reply(reply.start, (*reply.tokens, token), reply.fed)
                if len(reply.tokens) < sampling.max_tokens:
                    # Start the next step before handing this token out: the model thread
                    # works while the stage routes the output.
                    allow_end = len(reply.tokens) >= sampling.min_tokens
                    step = asyncio.ensure_future(
                        self.call(self._decode, conversation, token, allow_end, sampling)
                    )
                yield out
                if step is None:
                    break
                token, embed = await step
                step = None
                reply = conversation.reply = Reply(reply.start, reply.tokens, reply.fed + 1)
            if signal.aborted:
                return
            outcome = "done"
        except GeneratorExit:
            outcome = "cancelled"
            raise
        except Exception:
            outcome = "failed"
            raise
        finally:
            await self._settle(session, conversation, outcome, step, start)

    async def _settle(
        self,
        session: str,
        conversation: Conversation,
        outcome: _Outcome,
        step: asyncio.Future[Token] | None,
        start: Checkpoint,
    ) -> None:
        """Leave the session's state as the response's outcome says (module docstring)."""
        conversation.signal = None
        if outcome == "dropped" or self._sessions.get(session) is not conversation:
            if step is not None:
                step.cancel()  # the thread finishes it; its cache goes with the session
            if self._sessions.get(session) is conversation:
                del self._sessions[session]
            return
        if step is not None:
            # A decode step runs in the model thread and writes the cache: wait for it,
            # so the cache holds exactly the tokens yielded (it fed the last one).
            try:
                await step
            except Exception:
                outcome = "failed"
            except BaseException:
                del self._sessions[session]  # cancelled while waiting: an abort
                raise
            else:
                reply = conversation.reply
                assert reply is not None, "a decode step only runs in a reply"
                conversation.reply = Reply(reply.start, reply.tokens, reply.fed + 1)
        if outcome == "failed":
            conversation.restore(start)
        elif conversation.reply is not None and conversation.turns_since_reply == 0:
            reply = conversation.reply
            # Tokens yielded but not fed (the last one, at the token limit) close the
            # turn before whatever comes next, with <|im_end|> \n.
            conversation.carry = [*reply.tokens[reply.fed :], *CLOSE_TURN]

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

    async def truncate(self, session: str, kept: int) -> int:
        """Cut ``session``'s last reply to its first ``kept`` tokens (between responses).

        The cache is cropped into the reply and the kept part closed with ``<|im_end|>
        \\n`` before the next input. During a response, send the ``truncate`` mark in its
        input instead.

        Returns:
            0: the thinker is the entry stage; no stage before it keeps anything.

        Raises:
            ValueError: the session has no reply, is generating, or committed a user
                turn after its reply.
        """
        conversation = self._sessions.get(session)
        if conversation is None:
            raise ValueError(f"session {session!r} has no reply to truncate")
        if conversation.signal is not None:
            raise ValueError(
                f"session {session!r} is generating: send the truncate mark in its input"
            )
        conversation.truncate(kept)
        return 0

    # -- input ------------------------------------------------------------------------

    async def _take(self, conversation: Conversation, turn: UserTurn, fields: Fields) -> None:
        """Add one input chunk to the user turn, prefilling what can be prefilled now."""
        audio = fields.get("audio")
        text = fields.get("text")
        heard = isinstance(audio, torch.Tensor) and audio.numel() > 0
        said = isinstance(text, str) and text != ""
        if not (heard or said):
            return
        turn.open(conversation.carry)
        if isinstance(audio, torch.Tensor) and heard:
            if turn.clip is None:
                mel = LogMel(self._extractor, block=2 * self._n_window)
                turn.clip = AudioClip(mel, self._n_window, self._n_window_infer)
            turn.clip.push(audio.detach().to(torch.float32).reshape(-1).numpy())
        if isinstance(text, str) and said:
            await self.call(self._prefill, conversation, turn, True, configs.encode_text(text))
        elif turn.clip is not None and turn.clip.window_ready():
            await self.call(self._prefill, conversation, turn, False, [])

    async def _commit(self, conversation: Conversation, turn: UserTurn) -> Fields | None:
        """Close the user turn (nothing if none is open); its rows as an output."""
        if not turn.opened:
            return None
        await self.call(self._prefill, conversation, turn, True, list(CLOSE_TURN))
        conversation.turns_since_reply += 1
        return turn.user_rows()

    async def _truncate(self, conversation: Conversation, turn: UserTurn, kept: int) -> None:
        """Cut the last reply, then feed again what the open turn had prefilled after it."""
        conversation.truncate(kept)
        replay = turn.replay(conversation.carry)
        if replay is not None:
            await self.call(self._feed, conversation, turn, replay)

    def _sampling(
        self, session: str, conversation: Conversation, options: ResponseOptions
    ) -> _Sampling:
        max_tokens = self.max_new_tokens if options.max_tokens is None else options.max_tokens
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        temperature = options.temperature or 0.0
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        generator = None
        if temperature > 0:
            if conversation.generator is None:
                conversation.generator = torch.Generator().manual_seed(self._seed_of(session))
            generator = conversation.generator
        min_tokens = min(self.min_new_tokens, max_tokens)
        return _Sampling(max_tokens, min_tokens, temperature, generator)

    def _seed_of(self, session: str) -> int:
        """The session's sampling seed: stable across runs (see the module docstring)."""
        digest = hashlib.blake2b(f"{self.seed}/{session}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & (2**63 - 1)

    # -- model thread -------------------------------------------------------------------

    def _prefill(
        self, conversation: Conversation, turn: UserTurn, end_clip: bool, then: list[int]
    ) -> None:
        """Prefill the turn's pending ids, its clip's new windows (all of the clip if
        ``end_clip``), then ``then``."""
        embeds = None
        if turn.clip is not None:
            clip, encode = turn.clip, self._encode
            embeds = clip.finish(encode) if end_clip else clip.windows(encode)
        feed = turn.next_feed(embeds, end_clip, then)
        if feed.ids:
            self._feed(conversation, turn, feed)

    @torch.no_grad()
    def _feed(self, conversation: Conversation, turn: UserTurn, feed: Feed) -> None:
        """One forward over ``feed``; its rows go to the turn."""
        step = self._forward(conversation, feed.ids, feed.audio)
        if feed.skip:
            conversation.carry = []
        placeholders = torch.tensor(feed.ids) == Tokens.AUDIO_PAD
        rows = torch.where(placeholders[:, None], step.accept_hidden[0], step.embeds[0])
        turn.keep(feed, rows, placeholders)

    def _encode(self, mel: torch.Tensor) -> torch.Tensor:
        return stepping.encode_audio(self._thinker, mel)

    def _forward(
        self, conversation: Conversation, ids: list[int], audio: torch.Tensor | None = None
    ) -> stepping.ThinkerStep:
        step = stepping.thinker_forward(
            self._thinker,
            torch.tensor([ids]),
            conversation.cache,
            conversation.position,
            accept_layer=self._accept_layer,
            audio_embeds=audio,
        )
        conversation.position += len(ids)
        return step

    @torch.no_grad()
    def _open_reply(self, conversation: Conversation, sampling: _Sampling) -> Token:
        """Feed the carry and ``<|im_start|> ASSISTANT \\n``; pick the first token."""
        step = self._forward(conversation, [*conversation.carry, *ASSISTANT_OPENING])
        conversation.carry = []
        return self._pick(step.logits[0, -1], sampling.min_tokens == 0, sampling)

    @torch.no_grad()
    def _decode(
        self, conversation: Conversation, token: int, allow_end: bool, sampling: _Sampling
    ) -> Token:
        """Feed ``token``, pick the next one."""
        step = self._forward(conversation, [token])
        return self._pick(step.logits[0, -1], allow_end, sampling)

    @torch.no_grad()
    def _pick(self, logits: torch.Tensor, allow_end: bool, sampling: _Sampling) -> Token:
        """A printable token (or im_end), greedy or sampled, and its [1, H] embedding."""
        masked = logits + (self._allow_end if allow_end else self._allow_text)
        if sampling.temperature > 0:
            probs = torch.softmax(masked / sampling.temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=sampling.generator))
        else:
            token = int(masked.argmax())
        return token, self._embedding(torch.tensor([token]))


def _kept(fields: Fields) -> int:
    kept = fields.get(KEPT_FIELD)
    if not isinstance(kept, torch.Tensor) or kept.numel() != 1:
        raise ValueError(f"a truncate mark needs {KEPT_FIELD!r}: a 0-d tensor of tokens to keep")
    return int(kept)
