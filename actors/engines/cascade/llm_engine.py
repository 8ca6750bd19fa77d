"""``LlmEngine`` (kind ``cascade.llm``): a text causal LM as a conversation engine.

The cascade's middle stage: it takes the user's turns as text (the recognizer's
transcripts, or text the caller typed), the caller's turn marks and instructions, and
replies with text, one output per token. It is the conversation engines' state machine
(:func:`~omni_actors.actors.engines.conversation.respond`) on the conversation state the
Qwen3-Omni thinker keeps (:class:`~omni_actors.actors.engines.qwen3_omni.conversation.Conversation`:
a KV slot, a carry that closes the last reply, checkpoints that are positions), over a
text LM on the engine's :class:`~omni_actors.actors.engines.step_loop.StepLoop` and
:class:`~omni_actors.actors.engines.qwen3_omni.slot_cache.SlotCache`
(:class:`~.llm_model.TextModel`): sessions share steps, a ``clear``, a failure or a
truncation moves the slot's length back, and nothing is copied per turn.

A user turn's text is gathered as it arrives and prefilled once the turn is committed
(a ``commit`` mark, or the end of the input, which opens the reply in the same forward):
the chat template's turns (``<|im_start|>role\\n ... <|im_end|>\\n``, the release's
tokenizer) as a Qwen3 release writes them. A response's own instructions are a system
turn fed right before its reply and dropped once the reply is kept, as the thinker's
are. Tokens are greedy; a reply never picks an id past its tokenizer's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Final

import torch
from pydantic import Field

from omni_actors.actors.engines.cascade.family import stage_checkpoint
from omni_actors.actors.engines.cascade.llm_model import Feeding, TextChunk, TextModel
from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    KEPT_FIELD,
    REPLY_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
    Rule,
)
from omni_actors.actors.engines.conversation import Outcome, Response, respond
from omni_actors.actors.engines.qwen3_omni.conversation import (
    Checkpoint,
    Conversation,
    ThinkerReply,
)
from omni_actors.actors.engines.step_loop import RequestClosedError
from omni_actors.actors.engines.stepped_engine import StepLoopArgs, SteppedTorchEngine
from omni_actors.actors.engines.torch_engine import AbortSignal, DeviceArgs
from omni_actors.models.family import WeightsArgs

__all__ = ["LLM_INPUTS", "LLM_OUTPUTS", "LlmArgs", "LlmEngine"]

LLM_INPUTS: Final[Mapping[str, Rule]] = MappingProxyType(
    {
        "text": "concat",
        TURN_FIELD: "concat",
        KEPT_FIELD: "concat",
        REPLY_FIELD: "concat",
        INSTRUCTIONS_FIELD: "concat",
    }
)
"""What the LLM takes: user text, turn marks, instructions."""

LLM_OUTPUTS: Final[Mapping[str, Rule]] = MappingProxyType({"token_ids": "concat", "text": "concat"})
"""What the LLM yields: per token its id and the text it adds to the reply."""


class LlmArgs(WeightsArgs, DeviceArgs, StepLoopArgs):
    """The LLM's arguments (``model``, ``seed``, ``cache_dir`` locate its checkpoint).

    Attributes:
        max_context: the most positions a session's KV slot holds.
        max_new_tokens: a reply's most tokens (a response's ``max_tokens`` overrides it).
        min_new_tokens: the end of turn is masked until that many tokens exist.
        allowed_token_ranges: half-open ``[start, stop)`` id ranges a reply may use; none:
            any (for random weights, which would pick unprintable ids).
    """

    max_context: int = Field(4096, ge=16)
    max_new_tokens: int = Field(256, ge=1)
    min_new_tokens: int = Field(0, ge=0)
    allowed_token_ranges: list[tuple[int, int]] | None = None


class LlmEngine(SteppedTorchEngine[Conversation, Feeding, int | None]):
    """Text replies to text turns (see the module docstring)."""

    kind: ClassVar[str] = "cascade.llm"
    Args: ClassVar[type[LlmArgs]] = LlmArgs
    inputs: ClassVar[Mapping[str, Rule]] = LLM_INPUTS
    outputs: ClassVar[Mapping[str, Rule]] = LLM_OUTPUTS
    streams_input: ClassVar[bool] = True

    def __init__(self, args: LlmArgs) -> None:
        self._args = args
        self.max_new_tokens = args.max_new_tokens
        super().__init__(
            stage_checkpoint(args, "llm"),
            "llm",
            args.device,
            args=args,
            max_context=args.max_context,
        )

    def _load(self, path: Path) -> None:
        args = self._args
        self.model = TextModel(
            path,
            self.device,
            slots=args.max_sessions,
            max_context=args.max_context,
            allowed_token_ranges=args.allowed_token_ranges,
        )
        encode = self.encode
        self.user_opening = encode("<|im_start|>user\n")
        self.assistant_opening = encode("<|im_start|>assistant\n")
        self.close_turn = encode("<|im_end|>\n")

    def _step(self, chunks: list[TextChunk]) -> list[int | None]:
        return self.model.step(chunks)

    def encode(self, text: str) -> tuple[int, ...]:
        """The ids of ``text`` (special tokens spelled in it are theirs)."""
        return tuple(self.model.tokenizer.encode(text, add_special_tokens=False))

    def system_turn(self, instructions: str) -> tuple[int, ...]:
        """The system turn of ``instructions`` (none for an empty one)."""
        if not instructions:
            return ()
        return self.encode(f"<|im_start|>system\n{instructions}<|im_end|>\n")

    def last_reply(self, session: str) -> tuple[int, ...] | None:
        """The token ids of the reply ``session``'s last ``generate`` decoded (None: none)."""
        conversation = self._sessions.get(session)
        return None if conversation is None else conversation.decoded

    def prompt_tokens(self, session: str) -> int | None:
        """The tokens the last reply of ``session`` was decoded after."""
        conversation = self._sessions.get(session)
        if conversation is None or conversation.decoded is None or conversation.reply is None:
            return None
        return conversation.reply.start

    def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """One response: the input's turns and marks, then the reply, one token each."""
        return respond(lambda: self._respond(session), inputs)

    def _respond(self, session: str) -> _Response:
        conversation = self._sessions.get(session)
        if conversation is None:
            request = self.loop.open(session)
            conversation = self._sessions[session] = Conversation(request, self.loop)
        if conversation.signal is not None:
            raise ValueError(f"session {session!r} is already generating")
        conversation.signal = AbortSignal()
        conversation.decoded = None
        return _Response(self, session, conversation, conversation.signal)


class _Response(Response[Checkpoint]):
    """One response of the LLM on the session's :class:`Conversation`."""

    def __init__(
        self, engine: LlmEngine, session: str, conversation: Conversation, signal: AbortSignal
    ) -> None:
        super().__init__(signal, engine.model.vocab_size)
        self.engine, self.session, self.conversation = engine, session, conversation
        self.text: list[str] = []
        """The open user turn's text (None open while empty and not opened)."""
        self.opened = False
        self.waiting: tuple[int, ...] = ()
        """A system turn set while the user turn is open: fed right behind it."""
        self.instructed: tuple[int, ...] = ()
        self.step: asyncio.Future[list[int | None]] | None = None
        self.decoding = False

    def checkpoint(self) -> Checkpoint:
        return self.conversation.checkpoint()

    async def roll_back(self, start: Checkpoint) -> None:
        self.conversation.restore(start)
        if self.instructed:
            self.conversation.queue_system(self.instructed)

    async def _feed(
        self, ids: tuple[int, ...], then: Callable[[list[int | None]], None], pick: bool = False
    ) -> int | None:
        """Feed ``ids`` behind nothing else (``then`` settles the conversation); the
        token picked after them when ``pick`` (None if aborted meanwhile)."""
        if not ids:
            then([])
            return None
        allow_end = self.engine._args.min_new_tokens == 0
        feeding = Feeding(ids, pick=pick, allow_end=allow_end)
        try:
            outputs = await self.engine.feed(self.conversation, feeding, len(ids), then)
        except RequestClosedError:
            if self.signal.aborted:
                return None
            raise
        return outputs[-1]

    def _user_turn(self) -> tuple[int, ...]:
        engine = self.engine
        body = engine.encode("".join(self.text))
        return (*engine.user_opening, *body, *engine.close_turn, *self.waiting)

    async def instruct(
        self, instructions: torch.Tensor | str | None, tools: torch.Tensor | str | None = None
    ) -> bool:
        if tools is not None:
            raise ValueError("the cascade's LLM takes no tools yet; leave tools unset")
        if instructions is None:
            return False
        if not isinstance(instructions, str):
            raise ValueError(f"{INSTRUCTIONS_FIELD} must be text")
        system = self.engine.system_turn(instructions)
        self.instructed = system
        if self.opened:
            self.waiting = system
            return False
        await self._instruct(system)
        return True

    async def _instruct(self, system: tuple[int, ...]) -> None:
        conversation = self.conversation

        def then(_: list[int | None]) -> None:
            conversation.carry = []
            conversation.system = (*conversation.system, *system)

        await self._feed((*conversation.carry, *system), then)

    async def take(self, fields: Fields) -> None:
        text = fields.get("text")
        if isinstance(text, str) and text:
            self.text.append(text)
            self.opened = True

    async def commit(self) -> Fields | None:
        if not self.opened:
            return None
        conversation, system = self.conversation, self.waiting
        ids = (*conversation.carry, *self._user_turn())

        def then(_: list[int | None]) -> None:
            conversation.carry = []
            conversation.turns_since_reply += 1
            if system:
                conversation.system = (*conversation.system, *system)

        self.text, self.opened, self.waiting = [], False, ()
        await self._feed(ids, then)
        return None

    async def clear(self, committed: Checkpoint) -> None:
        waiting = self.waiting
        self.conversation.restore(committed)
        self.text, self.opened, self.waiting = [], False, ()
        if waiting:
            await self._instruct(waiting)

    async def truncate(self, kept: int) -> None:
        self.conversation.truncate(kept, self.engine.close_turn)

    def moved_start(self) -> None:
        self.instructed = ()

    async def take_reply(self, tokens: tuple[int, ...]) -> None:
        conversation, engine = self.conversation, self.engine

        def then(_: list[int | None]) -> None:
            conversation.carry = [*engine.close_turn]
            start = conversation.position - len(tokens)
            conversation.reply = ThinkerReply(start, tokens, len(tokens))
            conversation.turns_since_reply, conversation.system = 0, ()

        await self._feed((*conversation.carry, *engine.assistant_opening, *tokens), then)

    def encode(self, text: str) -> list[int]:
        return list(self.engine.encode(text))

    async def instruct_reply(self, instructions: str, tools: str | None = None) -> None:
        if tools is not None and tools != "[]":
            raise ValueError("the cascade's LLM takes no tools yet; leave tools unset")
        await self._instruct(self.engine.system_turn(instructions))

    async def drop_instructions(self, before: Checkpoint) -> None:
        conversation = self.conversation
        reply = conversation.reply if self.decoding else None
        conversation.restore(before)
        if reply is not None:
            await self.take_reply(reply.tokens)

    async def reply(self, options: ResponseOptions) -> AsyncGenerator[Fields, None]:
        engine, conversation, signal = self.engine, self.conversation, self.signal
        args = engine._args
        max_tokens = options.max_tokens or args.max_new_tokens
        min_tokens = min(args.min_new_tokens, max_tokens)
        turn = self._user_turn() if self.opened else ()
        system = self.waiting
        ids = (*conversation.carry, *turn, *engine.assistant_opening)

        def opened(_: list[int | None]) -> None:
            conversation.carry = []
            if turn:
                conversation.turns_since_reply += 1
            if system:
                conversation.system = (*conversation.system, *system)

        self.text, self.opened, self.waiting = [], False, ()
        token = await self._feed(ids, opened, pick=True)
        if token is None:
            return
        reply = conversation.reply = ThinkerReply(conversation.position, (), 0)
        self.decoding = True
        conversation.turns_since_reply, conversation.system = 0, ()
        tokenizer, said = engine.model.tokenizer, ""
        while token != engine.model.end and not signal.aborted:
            tokens = (*reply.tokens, token)
            text = tokenizer.decode(list(tokens), skip_special_tokens=True)
            piece = ""
            if not text.endswith("\ufffd") and text.startswith(said):
                piece, said = text[len(said) :], text
            reply = conversation.reply = ThinkerReply(reply.start, tokens, reply.fed)
            if len(tokens) < max_tokens:
                feeding = Feeding((token,), pick=True, allow_end=len(tokens) >= min_tokens)
                self.step = engine.loop.submit(conversation.request, feeding, 1, decode=True)
            yield {"token_ids": torch.tensor([token]), "text": piece}
            if self.step is None:
                break
            try:
                (picked,) = await self.step
            except RequestClosedError:
                if signal.aborted:
                    break
                raise
            self.step = None
            assert picked is not None, "a decode step picks"
            token = picked
            reply = conversation.reply = ThinkerReply(reply.start, reply.tokens, reply.fed + 1)

    def end(self) -> None:
        self.conversation.signal = None

    def held(self) -> bool:
        return self.engine._sessions.get(self.session) is self.conversation

    def forget(self) -> None:
        if self.step is not None:
            self.step.cancel()
        if self.held():
            del self.engine._sessions[self.session]

    async def finish(self, outcome: Outcome) -> Outcome:
        if self.step is not None:
            # The decode step in flight writes the cache: wait for it, so the cache
            # holds exactly the tokens yielded.
            try:
                await self.step
            except Exception:
                outcome = "failed"
            except BaseException:
                del self.engine._sessions[self.session]
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
            close = self.engine.close_turn
            self.conversation.carry = [*reply.tokens[reply.fed :], *close]
            self.conversation.decoded = reply.tokens
