"""``ConversationEngine``: a conversation engine whose sessions are :class:`Conversation` s.

The torch thinker and the cascade's text LLM keep the same state per session (a
:class:`~.conversation.Conversation`: a KV slot of the engine's step loop, a carry that
closes the last reply, checkpoints that are positions) and do the same to it for most
steps of :func:`~omni_actors.actors.engines.conversation.respond`: rolling back, feeding
a system turn or a reply taken back, truncating, decoding a reply token by token,
settling it. That is written here once. An engine keeps what differs: its model's step
and payload, how a user turn is built (text and audio prefilled as they arrive, or text
gathered until the turn is committed), its instructions and tools, and what each token's
output carries.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Generic, Protocol, TypeVar

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.conversation import Outcome, Response
from omni_actors.actors.engines.qwen3_omni.conversation import (
    Checkpoint,
    Conversation,
    ThinkerReply,
)
from omni_actors.actors.engines.step_loop import RequestClosedError
from omni_actors.actors.engines.stepped_engine import SteppedTorchEngine
from omni_actors.actors.engines.torch_engine import AbortSignal

__all__ = ["ConversationEngine", "ConversationResponse", "Payload"]


class Payload(Protocol):
    """What the base reads of a model's work payload: the ids it feeds."""

    @property
    def ids(self) -> Sequence[int]:
        """The token ids fed (one position each)."""
        ...


P = TypeVar("P", bound=Payload)
Out = TypeVar("Out")


class ConversationEngine(SteppedTorchEngine[Conversation, P, Out]):
    """A :class:`SteppedTorchEngine` holding one :class:`Conversation` per session.

    Subclasses set the chat template's :attr:`close_turn` and :attr:`assistant_opening`
    when they load, and make their :class:`ConversationResponse` in :meth:`_response`;
    their ``generate`` returns ``respond(lambda: self._respond(session), inputs)``.
    """

    close_turn: tuple[int, ...]
    """``<|im_end|>\\n``: what ends every turn (set at load)."""
    assistant_opening: tuple[int, ...]
    """``<|im_start|>assistant\\n``: what opens a reply (set at load)."""

    def last_reply(self, session: str) -> tuple[int, ...] | None:
        """The token ids of the reply ``session``'s last ``generate`` decoded.

        A cancelled reply's as far as it was yielded; ``()`` for one that ended at once
        (the end of turn first: the turn is in the conversation); None when that call
        decoded no reply (cancelled before its first token, or still running), failed,
        or the session is unknown. Replies taken from ``reply`` marks are not counted: the
        caller has them already.
        """
        conversation = self._sessions.get(session)
        return None if conversation is None else conversation.decoded

    def prompt_tokens(self, session: str) -> int | None:
        """The tokens the reply of ``session``'s last ``generate`` was decoded after
        (the conversation so far and the reply's opening: its prompt); None when
        :meth:`last_reply` is None."""
        conversation = self._sessions.get(session)
        if conversation is None or conversation.decoded is None or conversation.reply is None:
            return None
        return conversation.reply.start

    def _respond(self, session: str) -> ConversationResponse[P, Out]:
        """Start a response of ``session``: its conversation (made on its first)."""
        conversation = self._sessions.get(session)
        if conversation is None:
            request = self.loop.open(session)
            conversation = self._sessions[session] = Conversation(request, self.loop)
        if conversation.signal is not None:
            raise ValueError(f"session {session!r} is already generating")
        conversation.signal = AbortSignal()
        conversation.decoded = None
        return self._response(session, conversation, conversation.signal)

    def _response(
        self, session: str, conversation: Conversation, signal: AbortSignal
    ) -> ConversationResponse[P, Out]:
        """The engine's response of ``session`` on ``conversation``, under ``signal``."""
        raise NotImplementedError


class ConversationResponse(Response[Checkpoint], Generic[P, Out]):
    """The steps of ``respond`` every :class:`ConversationEngine` takes alike.

    A subclass builds the user turn (``take``, ``commit``, ``clear``'s
    :meth:`_drop_turn`), sets instructions, and opens the reply, then decodes it with
    :meth:`_decode`; :meth:`_feeding` and :meth:`_pick` tell its model's payload and
    output.

    Args:
        engine: the engine (its step loop and chat template).
        session: the session's key in the engine's table.
        conversation: the session's state.
        signal: the session's abort signal, set for this response.
        vocab_size: the engine's vocabulary (a ``reply`` mark's ids must be below it).
    """

    def __init__(
        self,
        engine: ConversationEngine[P, Out],
        session: str,
        conversation: Conversation,
        signal: AbortSignal,
        vocab_size: int,
    ) -> None:
        super().__init__(signal, vocab_size)
        self.engine = engine
        self.session = session
        self.conversation = conversation
        self.instructed: tuple[int, ...] = ()
        """The last instructions set since ``start``: a failure keeps them."""
        self.step: asyncio.Future[list[Out]] | None = None
        """The decode step in flight in the model thread (it writes the cache)."""
        self.decoding = False
        """This response's reply is open."""
        self.deferred: list[tuple[P, Callable[[list[Out]], None]]] = []
        """Feeds to submit with the next one (:meth:`_defer`)."""

    # -- what the model differs in ---------------------------------------------------

    def _feeding(self, ids: list[int]) -> P:
        """The payload that feeds ``ids`` and picks nothing."""
        raise NotImplementedError

    def _pick(self, out: Out) -> int:
        """The token a step's output ``out`` picked (of a work that asked for one)."""
        raise NotImplementedError

    def _drop_turn(self) -> tuple[int, ...]:
        """Drop the open user turn (a ``clear``); the system turn waiting behind it."""
        raise NotImplementedError

    # -- checkpoints ----------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        return self.conversation.checkpoint()

    async def roll_back(self, start: Checkpoint) -> None:
        self.conversation.restore(start)
        if self.instructed:
            self.conversation.queue_system(self.instructed)

    # -- forwards: work on the engine's step loop -----------------------------------

    async def _feed(self, feeding: P, then: Callable[[list[Out]], None] | None = None) -> list[Out]:
        """Feed ``feeding`` on the step loop (:meth:`SteppedTorchEngine.feed`); no
        outputs if the session is aborted meanwhile (the caller ends there)."""
        if not feeding.ids:
            if then is not None:
                then([])
            return []
        try:
            earlier = self._submit_deferred()
            outputs = await self.engine.feed(self.conversation, feeding, len(feeding.ids), then)
            for future in earlier:  # they ran before this one: a failure of theirs is ours
                await future
        except RequestClosedError:
            if self.signal.aborted:
                return []  # the session's request closed under it: the caller ends
            raise
        return outputs

    def _defer(self, feeding: P, then: Callable[[list[Out]], None]) -> None:
        """Feed ``feeding`` with the next feed, in the same step (a text turn, with the
        reply's opening behind it: one forward where there were two, and each costs a
        fixed launch overhead on a GPU). Anything else that reads the state ``then``
        changes feeds it first (:meth:`before_input`, :meth:`finish`)."""
        self.deferred.append((feeding, then))

    def _submit_deferred(self) -> list[asyncio.Future[list[Out]]]:
        deferred, self.deferred = self.deferred, []
        futures = []
        for feeding, then in deferred:
            if feeding.ids:
                engine = self.engine
                futures.append(engine.queue(self.conversation, feeding, len(feeding.ids), then))
            else:
                then([])
        return futures

    async def _feed_deferred(self) -> None:
        """Feed what :meth:`_defer` holds, and wait for it."""
        try:
            for future in self._submit_deferred():
                await asyncio.shield(future)
        except RequestClosedError:
            if not self.signal.aborted:
                raise

    async def before_input(self, fields: Fields) -> None:
        await self._feed_deferred()

    async def _instruct(self, system: tuple[int, ...]) -> None:
        """Feed the system turn ``system`` behind the carry (no user turn is open)."""
        conversation = self.conversation

        def then(_: list[Out]) -> None:
            conversation.carry = []
            conversation.system = (*conversation.system, *system)

        await self._feed(self._feeding([*conversation.carry, *system]), then)

    # -- marks ----------------------------------------------------------------------

    async def clear(self, committed: Checkpoint) -> None:
        waiting = self._drop_turn()
        self.conversation.restore(committed)
        if waiting:  # no turn is open now for them to wait behind
            await self._instruct(waiting)

    async def truncate(self, kept: int) -> None:
        self.conversation.truncate(kept, self.engine.close_turn)

    async def take_reply(self, tokens: tuple[int, ...]) -> None:
        """Take ``tokens`` into the conversation as the assistant's turn, as if decoded.

        One feed of the carry, ``<|im_start|> assistant \\n`` and the tokens; the turn
        is then left as a completed reply leaves it (``<|im_end|> \\n`` in the carry, a
        :class:`ThinkerReply` a truncation can cut, no user turn or system turn after it).
        """
        conversation, engine = self.conversation, self.engine

        def then(_: list[Out]) -> None:
            conversation.carry = [*engine.close_turn]
            start = conversation.position - len(tokens)
            conversation.reply = ThinkerReply(start, tokens, len(tokens))
            conversation.turns_since_reply, conversation.system = 0, ()

        opening = engine.assistant_opening
        await self._feed(self._feeding([*conversation.carry, *opening, *tokens]), then)

    async def drop_instructions(self, before: Checkpoint) -> None:
        conversation = self.conversation
        reply = conversation.reply if self.decoding else None
        generator = conversation.generator
        rng = None if generator is None else generator.get_state()
        conversation.restore(before)
        if generator is not None and rng is not None:
            generator.set_state(rng)  # the next sampled reply goes on from this one
        if reply is not None:
            await self.take_reply(reply.tokens)

    # -- the reply ------------------------------------------------------------------

    async def _decode(
        self,
        opened: Out,
        *,
        end: int,
        max_tokens: int,
        min_tokens: int,
        decode: Callable[[int, bool], P],
    ) -> AsyncGenerator[tuple[int, Out], None]:
        """Decode the reply whose first token ``opened`` picked, until ``end`` or
        ``max_tokens``: each token with the output that picked it.

        ``decode(token, allow_end)`` is the payload of the step that feeds ``token`` and
        picks the next (the end allowed once ``min_tokens`` exist). That step is started
        before the token is handed out, so the model thread works while the stage routes
        the output.
        """
        engine, conversation, signal = self.engine, self.conversation, self.signal
        reply = conversation.reply = ThinkerReply(conversation.position, (), 0)
        self.decoding = True
        conversation.turns_since_reply, conversation.system = 0, ()
        out, token = opened, self._pick(opened)
        while token != end and not signal.aborted:
            reply = conversation.reply = ThinkerReply(
                reply.start, (*reply.tokens, token), reply.fed
            )
            if len(reply.tokens) < max_tokens:
                allow_end = len(reply.tokens) >= min_tokens
                work = decode(token, allow_end)
                self.step = engine.loop.submit(conversation.request, work, 1, decode=True)
            yield token, out
            if self.step is None:
                break
            try:
                (out,) = await self.step
            except RequestClosedError:
                if signal.aborted:
                    break
                raise
            self.step = None
            token = self._pick(out)
            reply = conversation.reply = ThinkerReply(reply.start, reply.tokens, reply.fed + 1)

    # -- settling -------------------------------------------------------------------

    def end(self) -> None:
        self.conversation.signal = None

    def held(self) -> bool:
        return self.engine._sessions.get(self.session) is self.conversation

    def forget(self) -> None:
        if self.step is not None:
            self.step.cancel()  # the thread finishes it; its cache goes with the session
        if self.held():
            del self.engine._sessions[self.session]

    async def finish(self, outcome: Outcome) -> Outcome:
        if outcome == "dropped":
            self.deferred.clear()  # the conversation goes with the session (forget)
        try:
            await self._feed_deferred()
        except Exception:
            outcome = "failed"
        except BaseException:
            del self.engine._sessions[self.session]  # cancelled while waiting: an abort
            raise
        if self.step is not None:
            # A decode step runs in the model thread and writes the cache: wait for it,
            # so the cache holds exactly the tokens yielded (it fed the last one).
            try:
                await self.step
            except Exception:
                outcome = "failed"
            except BaseException:
                del self.engine._sessions[self.session]  # cancelled while waiting: an abort
                raise
            else:
                reply = self.conversation.reply
                assert reply is not None, "a decode step only runs in a reply"
                self.conversation.reply = ThinkerReply(reply.start, reply.tokens, reply.fed + 1)
        return outcome

    def keep_reply(self) -> None:
        if self.decoding:
            reply = self.conversation.reply
            assert reply is not None, "a response's reply is the conversation's last"
            # Tokens yielded but not fed (the last one, at the token limit) close the
            # turn before whatever comes next, with <|im_end|> \n.
            self.conversation.carry = [*reply.tokens[reply.fed :], *self.engine.close_turn]
            self.conversation.decoded = reply.tokens
