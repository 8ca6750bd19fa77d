"""``LlmEngine`` (kind ``cascade.llm``): a text causal LM as a conversation engine.

The cascade's middle stage: it takes the user's turns as text (the recognizer's
transcripts, or text the caller typed), the caller's turn marks and instructions, and
replies with text, one output per token. It is the conversation engines' state machine
(:func:`~omni_actors.actors.engines.conversation.respond`) on the conversation state the
Qwen3-Omni thinker keeps (:class:`~omni_actors.actors.engines.qwen3_omni.conversation.Conversation`:
a KV slot, a carry that closes the last reply, checkpoints that are positions), and
what it does to that state is the thinker's too
(:class:`~omni_actors.actors.engines.qwen3_omni.conversation_engine.ConversationEngine`),
over a text LM on the engine's :class:`~omni_actors.actors.engines.step_loop.StepLoop` and
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

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
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
from omni_actors.actors.engines.conversation import respond
from omni_actors.actors.engines.qwen3_omni.conversation import Conversation
from omni_actors.actors.engines.qwen3_omni.conversation_engine import (
    ConversationEngine,
    ConversationResponse,
)
from omni_actors.actors.engines.stepped_engine import StepLoopArgs
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


class LlmEngine(ConversationEngine[Feeding, int | None]):
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

    def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """One response: the input's turns and marks, then the reply, one token each."""
        return respond(lambda: self._respond(session), inputs)

    def _response(self, session: str, conversation: Conversation, signal: AbortSignal) -> _Response:
        return _Response(self, session, conversation, signal)

    async def truncate(self, session: str, kept: int) -> int:
        """The user heard the first ``kept`` tokens of the last reply (what the
        synthesizer answered): that count, capped at the reply's. Nothing is cut here:
        the truncate mark the caller then sends the entry carries the count, and the
        recognizer passes it on to this stage's conversation, in order with the turns.

        Raises:
            ValueError: the session has no reply, is generating, or ``kept`` is negative.
        """
        conversation = self._sessions.get(session)
        if conversation is None or conversation.reply is None:
            raise ValueError(f"LLM session {session!r} has no reply to truncate")
        if conversation.signal is not None:
            raise ValueError(f"LLM session {session!r} is generating: cancel it first")
        if kept < 0:
            raise ValueError(f"cannot keep {kept} tokens; pass 0 or more")
        return min(kept, len(conversation.reply.tokens))


class _Response(ConversationResponse[Feeding, int | None]):
    """One response of the LLM on the session's :class:`Conversation`."""

    engine: LlmEngine

    def __init__(
        self, engine: LlmEngine, session: str, conversation: Conversation, signal: AbortSignal
    ) -> None:
        super().__init__(engine, session, conversation, signal, engine.model.vocab_size)
        self.text: list[str] = []
        """The open user turn's text (None open while empty and not opened)."""
        self.opened = False
        self.waiting: tuple[int, ...] = ()
        """A system turn set while the user turn is open: fed right behind it."""

    def _feeding(self, ids: list[int], pick: bool = False) -> Feeding:
        """Feed ``ids``; with ``pick``, the token after them."""
        return Feeding(tuple(ids), pick=pick, allow_end=self.engine._args.min_new_tokens == 0)

    def _pick(self, out: int | None) -> int:
        assert out is not None, "a decode step picks"
        return out

    def _drop_turn(self) -> tuple[int, ...]:
        waiting = self.waiting
        self.text, self.opened, self.waiting = [], False, ()
        return waiting

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

    async def take(self, fields: Fields) -> None:
        text = fields.get("text")
        if isinstance(text, str) and text:
            self.text.append(text)
            self.opened = True

    async def commit(self) -> Fields | None:
        if not self.opened:
            return None
        conversation, system = self.conversation, self.waiting
        ids = [*conversation.carry, *self._user_turn()]

        def then(_: list[int | None]) -> None:
            conversation.carry = []
            conversation.turns_since_reply += 1
            if system:
                conversation.system = (*conversation.system, *system)

        self.text, self.opened, self.waiting = [], False, ()
        await self._feed(self._feeding(ids), then)
        return None

    def moved_start(self) -> None:
        self.instructed = ()

    def encode(self, text: str) -> list[int]:
        return list(self.engine.encode(text))

    async def instruct_reply(self, instructions: str, tools: str | None = None) -> None:
        if tools is not None and tools != "[]":
            raise ValueError("the cascade's LLM takes no tools yet; leave tools unset")
        await self._instruct(self.engine.system_turn(instructions))

    async def reply(self, options: ResponseOptions) -> AsyncGenerator[Fields, None]:
        engine, conversation = self.engine, self.conversation
        args = engine._args
        max_tokens = options.max_tokens or args.max_new_tokens
        min_tokens = min(args.min_new_tokens, max_tokens)
        turn = self._user_turn() if self.opened else ()
        system = self.waiting
        ids = [*conversation.carry, *turn, *engine.assistant_opening]

        def opened(_: list[int | None]) -> None:
            conversation.carry = []
            if turn:
                conversation.turns_since_reply += 1
            if system:
                conversation.system = (*conversation.system, *system)

        self.text, self.opened, self.waiting = [], False, ()
        outputs = await self._feed(self._feeding(ids, pick=True), opened)
        if not outputs:
            return  # aborted
        tokenizer, said = engine.model.tokenizer, ""
        decoded: list[int] = []
        tokens = self._decode(
            outputs[-1],
            end=engine.model.end,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            decode=lambda token, allow_end: Feeding((token,), pick=True, allow_end=allow_end),
        )
        async with aclosing(tokens):
            async for token, _ in tokens:
                decoded.append(token)
                text = tokenizer.decode(decoded, skip_special_tokens=True)
                piece = ""
                if not text.endswith("\ufffd") and text.startswith(said):
                    piece, said = text[len(said) :], text
                yield {"token_ids": torch.tensor([token]), "text": piece}
