"""``ThinkerEngine``: tiny-omni's thinker as a conversation engine.

The entry stage: it answers the user's text and audio with text tokens plus what the
talker needs to speak them. Each ``generate`` call is one response of a conversation
whose KV cache the engine keeps per session (:class:`~.conversation.Conversation`).
Input is prefilled *while it arrives* (:class:`~.user_turn.UserTurn`: text per chunk,
audio per encoder window), so when the input ends only its tail is left to compute and
the first token comes quickly, however long the user spoke.

The input is user turns and turn marks (``omni_actors.actors.engines.contract``): ``commit``
closes the user turn and sends its rows to the talker; ``clear`` crops the cache back
to the last commit; ``truncate`` cuts the last reply to what the user heard; ``reply``
(a session replaying its conversation) commits the open turn if any and takes the
mark's tokens back as the assistant's turn, leaving the cache, the carry and the
:class:`~.conversation.ThinkerReply` as decoding them did, and yields nothing for it (the
talker conditions on user turns only). The end of the input commits what is pending,
then the reply opens (``<|im_start|> ASSISTANT \\n``) and decodes; with no input at
all, it replies to the conversation so far. :meth:`ThinkerEngine.last_reply` tells the
session the tokens of the reply the last response decoded, to replay it later.

The end of input commits the open turn in two steps: the rows it prefilled go out at
once (the talker prefills them meanwhile), then one forward over its tail,
``<|im_end|> \\n`` and the reply's opening picks the first token, which carries the tail's
rows. That forward is all the work between the end of the input and the first token.

A reply the stage closes (``aclose``, a barge-in) stays in the conversation as far as
it was yielded; closed before its first token, the committed turn stays without a
reply (its first rows are the talker's already; the rows of its tail, computed on
closing, are not sent). A response that fails is rolled back to where it started, or
to its truncation if its input cut a reply from before it (the cut part of the cache is
gone; a reply taken back in the same input goes with the rollback, cut or not). An
abort drops the session.

Instructions (``INSTRUCTIONS_FIELD``, a system prompt) set the conversation's
instructions from then on as a system turn (``conversation``): prefilled at once when
no user turn is open, else right behind the open turn when it is committed (by a mark
or by the end of input, in the forward that closes it); a later instruction replaces
one still waiting, and an empty one sets none. In a chunk with text or audio they come
first. A system turn stays through a ``clear`` (one waiting behind a cleared turn is
prefilled then), a truncation (fed again behind the cut reply) and a failed response
(the last instructions it set are fed again before whatever comes next): they are the
caller's setting, not the reply's. No row of a system turn goes to the talker.

Tokens are greedy unless a response asks for a temperature (see ``sampling``).

Decode steps of concurrent sessions share forwards (a
:class:`~omni_actors.actors.engines.batcher.Batcher` of steps, up to ``max_batch`` sessions,
caches left-padded by :mod:`.batched_step`); each session still picks with its own
sampling and generator. Prefills stay one session per forward. A session decoding
alone runs the single-session forward, token for token HF's; in a batch of several a
row's logits may differ in the last bits (tests compare tokens one session at a time).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import ClassVar, Literal

import torch
from pydantic import Field

from omni_actors.actors.engines.batched_engine import BatchedTorchEngine
from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    TURN_FIELD,
    Fields,
    Rule,
    response_options,
)
from omni_actors.actors.engines.thinker_ports import THINKER_INPUTS, THINKER_OUTPUTS
from omni_actors.actors.engines.tiny_omni import configs
from omni_actors.actors.engines.tiny_omni.configs import Tokens
from omni_actors.actors.engines.tiny_omni.conversation import (
    CLOSE_TURN,
    NEWLINE,
    Checkpoint,
    Conversation,
    ThinkerReply,
    system_turn,
)
from omni_actors.actors.engines.tiny_omni.family import TINY_OMNI
from omni_actors.actors.engines.tiny_omni.hf import DynamicCache
from omni_actors.actors.engines.tiny_omni.sampling import sampling_for, session_seed
from omni_actors.actors.engines.tiny_omni.thinker_model import (
    ASSISTANT_OPENING,
    DecodeStep,
    ThinkerModel,
    Token,
)
from omni_actors.actors.engines.tiny_omni.user_turn import UserTurn
from omni_actors.actors.engines.torch_engine import AbortSignal, DeviceArgs, stage_dir
from omni_actors.actors.engines.turn_marks import kept_of, reply_of
from omni_actors.models.family import WeightsArgs

__all__ = ["ASSISTANT_OPENING", "NEWLINE", "ThinkerArgs", "ThinkerEngine"]


class ThinkerArgs(WeightsArgs, DeviceArgs):
    """The thinker's arguments: ``seed`` and ``cache_dir`` locate its weights.

    Attributes:
        max_new_tokens: a reply's most tokens (a response's ``max_tokens`` overrides it).
        min_new_tokens: ``<|im_end|>`` is masked until that many tokens exist; capped
            at the reply's maximum (setting only a small maximum means "at most that
            many", not a conflict).
        max_batch: the most sessions whose decode steps share one forward (module
            docstring): bounds how long one step takes; 1 decodes every session alone.
    """

    max_new_tokens: int = Field(48, ge=1)
    min_new_tokens: int = Field(8, ge=0)
    max_batch: int = Field(16, ge=1)


_Outcome = Literal["done", "cancelled", "failed", "dropped"]


class ThinkerEngine(BatchedTorchEngine[Conversation, DecodeStep, Token]):
    """Byte-level text replies with streaming prefill (see the module docstring).

    Its ports are the thinker stage's (:mod:`omni_actors.actors.engines.thinker_ports`): a
    token's ``text`` is its byte as a one-character str, and the ``user`` rows at audio
    placeholders are the hidden states at ``accept_hidden_layer``, what
    ``stepping.talker_user_part`` selects from.

    Args:
        args: see :class:`ThinkerArgs`.

    Raises:
        ModelNotPreparedError: the weights are not prepared.
    """

    kind: ClassVar[str] = "tiny-omni.thinker"
    Args: ClassVar[type[ThinkerArgs]] = ThinkerArgs
    inputs: ClassVar[Mapping[str, Rule]] = THINKER_INPUTS
    outputs: ClassVar[Mapping[str, Rule]] = THINKER_OUTPUTS
    streams_input: ClassVar[bool] = True

    def __init__(self, args: ThinkerArgs) -> None:
        self.max_new_tokens = args.max_new_tokens
        self.min_new_tokens = min(args.min_new_tokens, args.max_new_tokens)
        self.seed = args.seed
        super().__init__(
            stage_dir(TINY_OMNI.name, args, "thinker"),
            "thinker",
            max_batch=args.max_batch,
            batcher_name="thinker decode",
            device=args.device,
        )

    def _load(self, path: Path) -> None:
        self._model = ThinkerModel(path, self.device)

    def _run_steps(self, steps: list[DecodeStep]) -> list[Token]:
        return self._model.decode_steps(steps)

    # -- introspection -------------------------------------------------------------------

    def cached_tokens(self, session: str) -> int:
        """Positions in ``session``'s KV cache (0 when it has no state)."""
        conversation = self._sessions.get(session)
        return 0 if conversation is None else conversation.position

    def last_reply(self, session: str) -> tuple[int, ...] | None:
        """The token ids of the reply ``session``'s last ``generate`` decoded.

        A cancelled reply's as far as it was yielded; ``()`` for one that ended at once
        (``<|im_end|>`` first: the turn is in the conversation); None when that call
        decoded no reply (cancelled before its first token, or still running), failed,
        or the session is unknown. Replies taken from ``reply`` marks are not counted: the
        caller has them already.
        """
        conversation = self._sessions.get(session)
        return None if conversation is None else conversation.decoded

    # -- the engine protocol --------------------------------------------------------------

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """One response: prefill its input as it arrives, then decode one token per output.

        Input fields per chunk: ``text`` (str) and/or ``audio`` (float32 1-D, 16 kHz
        mono; in a chunk with both, the audio comes first), ``instructions`` (str; before
        either), or a turn mark (a ``reply`` mark's ``REPLY_FIELD``: a 1-D integer tensor
        of token ids). Outputs: see the class docstring.

        Raises:
            ValueError: the session is already generating, a mark is malformed (a reply
                mark's ids outside the vocabulary among it), a truncation has no reply to
                cut, instructions are not text, or the options are out of range.
        """
        conversation = self._sessions.get(session)
        if conversation is None:
            cache = DynamicCache(config=self._model.text_config)
            conversation = self._sessions[session] = Conversation(cache)
        if conversation.signal is not None:
            raise ValueError(f"session {session!r} is already generating")
        signal = conversation.signal = AbortSignal()
        conversation.decoded = None
        start = committed = conversation.checkpoint()
        turn = UserTurn()
        step: asyncio.Future[Token] | None = None
        unclosed: UserTurn | None = None  # being committed by the end of input, rows sent
        instructed: tuple[int, ...] = ()  # instructions set since ``start``: a failure keeps them
        decoding = False  # this response's reply is open
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
                    waiting = turn.system
                    conversation.restore(committed)
                    turn = UserTurn()
                    if waiting:  # no turn is open now for them to wait behind
                        await self.call(self._model.instruct, conversation, waiting)
                        committed = conversation.checkpoint()
                elif mark == "truncate":
                    earlier = conversation.reply is start.reply  # not one taken back since
                    conversation.truncate(kept_of(fields))
                    committed = conversation.checkpoint()
                    if earlier:
                        # The cut part of the cache is gone: a failure after it can only
                        # come back to here (what the user heard stays what they heard).
                        start = committed
                        instructed = turn.system  # those fed already are in the carry
                    await self._replay(conversation, turn)
                elif mark == "reply":
                    tokens = reply_of(fields, self._model.text_config.vocab_size)
                    rows = await self._commit(conversation, turn)
                    turn, committed = UserTurn(), conversation.checkpoint()
                    if rows is not None:
                        yield rows
                        if signal.aborted:
                            return
                    await self.call(self._model.take_reply, conversation, tokens)
                    committed = conversation.checkpoint()
                elif mark is not None:
                    raise ValueError(
                        f"unknown turn mark {mark!r}: commit, clear, truncate or reply"
                    )
                else:
                    if INSTRUCTIONS_FIELD in fields:
                        instructed = _system_turn(fields)
                        if turn.opened:
                            turn.system = instructed
                        elif instructed:
                            await self.call(self._model.instruct, conversation, instructed)
                            committed = conversation.checkpoint()  # a clear keeps them
                    await self._take(conversation, turn, fields)
                if signal.aborted:
                    return
            if signal.aborted:
                return
            sampling = sampling_for(
                response_options(inputs),
                max_new_tokens=self.max_new_tokens,
                min_new_tokens=self.min_new_tokens,
                generator=lambda: self._generator(session, conversation),
            )
            # The end of input commits the open turn: what it prefilled goes to the talker
            # now, the rest comes with the first token, from the one forward left.
            closing = turn if turn.opened else None
            if closing is not None and (rows := closing.take_rows()) is not None:
                unclosed = closing
                yield rows
            token, embed = await self.call(self._model.open_reply, conversation, closing, sampling)
            unclosed = None
            last_rows = None if closing is None else closing.take_rows()
            reply = conversation.reply = ThinkerReply(conversation.position, (), 0)
            decoding = True
            conversation.turns_since_reply, conversation.system = 0, ()
            while token != Tokens.IM_END and not signal.aborted:
                out: dict[str, torch.Tensor | str] = {
                    "token_ids": torch.tensor([token]),
                    "text": chr(token),
                    "embed": embed,
                }
                if not reply.tokens:
                    out.update(last_rows or {})
                    out["opening"] = self._model.opening
                    out["tts"] = self._model.tts
                reply = conversation.reply = ThinkerReply(
                    reply.start, (*reply.tokens, token), reply.fed
                )
                if len(reply.tokens) < sampling.max_tokens:
                    # Start the next step before handing this token out: the model thread
                    # works while the stage routes the output.
                    allow_end = len(reply.tokens) >= sampling.min_tokens
                    step = self.batcher.submit(DecodeStep(conversation, token, allow_end, sampling))
                yield out
                if step is None:
                    break
                token, embed = await step
                step = None
                reply = conversation.reply = ThinkerReply(reply.start, reply.tokens, reply.fed + 1)
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
            await self._settle(
                session, conversation, outcome, step, start, unclosed, instructed, decoding
            )

    async def _settle(
        self,
        session: str,
        conversation: Conversation,
        outcome: _Outcome,
        step: asyncio.Future[Token] | None,
        start: Checkpoint,
        unclosed: UserTurn | None,
        instructed: tuple[int, ...],
        decoding: bool,
    ) -> None:
        """Leave the session's state as the response's outcome says (module docstring)."""
        conversation.signal = None
        if outcome == "dropped" or self._sessions.get(session) is not conversation:
            if step is not None:
                step.cancel()  # the thread finishes it; its cache goes with the session
            if self._sessions.get(session) is conversation:
                del self._sessions[session]
            return
        if unclosed is not None and outcome == "cancelled":
            # Closed right after the turn's first rows went out: they are the talker's
            # now, so the turn stays, committed without a reply.
            try:
                await self._commit(conversation, unclosed)
            except Exception:
                outcome = "failed"
            except BaseException:
                del self._sessions[session]
                raise
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
                conversation.reply = ThinkerReply(reply.start, reply.tokens, reply.fed + 1)
        if outcome == "failed":
            conversation.restore(start)
            if instructed:
                conversation.queue_system(instructed)
        elif decoding:
            reply = conversation.reply
            assert reply is not None, "a response's reply is the conversation's last"
            # Tokens yielded but not fed (the last one, at the token limit) close the
            # turn before whatever comes next, with <|im_end|> \n.
            conversation.carry = [*reply.tokens[reply.fed :], *CLOSE_TURN]
            conversation.decoded = reply.tokens

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
                turn.clip = self._model.clip()
            turn.clip.push(audio.detach().to(torch.float32).reshape(-1).cpu().numpy())
        if isinstance(text, str) and said:
            ids = configs.encode_text(text)
            await self.call(self._model.prefill, conversation, turn, True, ids)
        elif turn.clip is not None and turn.clip.ready():
            await self.call(self._model.prefill, conversation, turn, False, [])

    async def _commit(self, conversation: Conversation, turn: UserTurn) -> Fields | None:
        """Close the user turn (nothing if none is open); its rows as an output."""
        if not turn.opened:
            return None
        then, system = [*CLOSE_TURN, *turn.system], len(turn.system)
        await self.call(self._model.prefill, conversation, turn, True, then, system)
        conversation.turns_since_reply += 1
        return turn.take_rows()

    async def _replay(self, conversation: Conversation, turn: UserTurn) -> None:
        """After a truncation, feed again what the open turn had prefilled after the reply."""
        replay = turn.replay(conversation.carry)
        if replay is not None:
            await self.call(self._model.feed, conversation, turn, replay)

    def _generator(self, session: str, conversation: Conversation) -> torch.Generator:
        if conversation.generator is None:
            seed = session_seed(self.seed, session)
            conversation.generator = torch.Generator().manual_seed(seed)
        return conversation.generator


def _system_turn(fields: Fields) -> tuple[int, ...]:
    text = fields[INSTRUCTIONS_FIELD]
    if not isinstance(text, str):
        raise ValueError(f"{INSTRUCTIONS_FIELD!r} must be text (a str), got a tensor")
    return system_turn(text)
