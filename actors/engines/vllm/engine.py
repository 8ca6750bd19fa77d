"""``VllmConversationEngine``: a conversation on vLLM, prefilling as input arrives.

What every vLLM engine here shares: the Qwen3-Omni thinker (:mod:`.thinker`, the
``vllm`` kind) adds audio input and the talker's rows to it; a text LLM
(:mod:`.llm`, ``cascade.llm-vllm``) is it as it is. A response's input, turn marks,
checkpoints and outcome are the conversation engines' state machine
(:func:`~omni_actors.actors.engines.conversation.respond`); what they do to vLLM's state
is below.

**One open request per conversation.** A session's conversation is a token list
(:class:`~.conversation.History`) and one vLLM request that holds its prefix
(:class:`~.request.OpenRequest`, vLLM's streaming input). Input is appended and
prefilled as it arrives (a chunk generating one token, dropped); a response appends the
assistant opening and generates the reply under the response's limits, and the request
stays open for the next turn. A reply that stopped at its token limit leaves its last
token unfed (vLLM drops a chunk's last sampled token), so it is fed with the turn's end.

**Rollbacks reopen.** vLLM's streaming input only appends; ``clear``, ``truncate``, a
cancelled reply (barge-in: the request is still decoding) and a failed response cut the
token list, end the request, and the next chunk opens a new request with the whole
conversation as its prompt, which vLLM's prefix cache serves without recomputing the
blocks it still holds.

**Replay.** A ``reply`` mark's tokens are appended as a decoded reply leaves the list,
and prefilled with what follows, so a ``truncate`` replayed after it cuts tokens vLLM
never held (no reopen). :meth:`VllmConversationEngine.last_reply` tells the session each
reply decoded, to replay it later. A mark that gives the turn by its words is tokenized
first, as user text is.

**A response's own instructions** (and tools) are a system turn appended before its
reply; once the reply is kept, the list is cut back to where they were appended and the
reply appended again as a ``reply`` mark's, and the request holding them ends (a
rollback).

**Text in, tokens out.** Text is tokenized with the model's tokenizer and turns are
framed by its chat template (:class:`~.turns.TurnTemplate`); each reply token goes out
as its id and the text it completes (:class:`~.reply_text.ReplyText`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    TOOL_CALLS_FIELD,
    TOOL_RESULT_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
    Rule,
)
from omni_actors.actors.engines.conversation import Outcome, Response, respond, settings
from omni_actors.actors.engines.tool_template import ToolTemplate, ToolTemplateError
from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.actors.engines.turn_marks import TurnMarkError
from omni_actors.actors.engines.vllm.args import VllmArgs
from omni_actors.actors.engines.vllm.conversation import Mark, VllmInputError
from omni_actors.actors.engines.vllm.reply_text import ReplyText
from omni_actors.actors.engines.vllm.request import OpenRequest
from omni_actors.actors.engines.vllm.runtime import VllmRuntime
from omni_actors.actors.engines.vllm.session import Session
from omni_actors.actors.engines.vllm.turns import TurnTemplate
from omni_actors.models.files import load_tokenizer

__all__ = ["ConversationResponse", "VllmConversationEngine"]


class VllmConversationEngine:
    """A conversation engine on vLLM's ``AsyncLLM`` (see the module docstring).

    A subclass says where its checkpoint is (:meth:`_checkpoint`) and may read more of
    it (:meth:`_load`), add engine arguments (:meth:`_engine_args`), set vLLM up once
    started (:meth:`_started`), and give its sessions and responses more to do
    (:meth:`_new_session`, :meth:`_response`).
    """

    kind: ClassVar[str]
    Args: ClassVar[type[VllmArgs]]
    inputs: ClassVar[Mapping[str, Rule]]
    outputs: ClassVar[Mapping[str, Rule]]
    streams_input: ClassVar[bool] = True

    def __init__(self, args: VllmArgs) -> None:
        self.args = args
        self.max_new_tokens = args.max_new_tokens
        self.min_new_tokens = min(args.min_new_tokens, args.max_new_tokens)
        self._sessions: dict[str, Session] = {}
        self._ids = itertools.count()
        self._llm: Any = None
        self.runtime: VllmRuntime | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.died: asyncio.Future[BaseException] | None = None
        """Resolves with the error when vLLM's engine process exits (the stage fails)."""
        self.vocab_size = 0
        """The model's vocabulary (its embedding rows): a ``reply`` mark's ids are below it."""
        self.placeholder: int | None = None
        """The audio placeholder id, for an engine that takes audio."""

    # -- what a subclass says --------------------------------------------------------------

    def _checkpoint(self) -> Path:
        """The release directory vLLM loads (its tokenizer is the conversation's)."""
        raise NotImplementedError

    async def _load(self, path: Path) -> None:
        """Read what the engine needs of the release besides its tokenizer (before vLLM
        starts); set :attr:`vocab_size`."""

    def _engine_args(self) -> dict[str, Any]:
        """``AsyncEngineArgs`` fields set over the pipeline's ``engine_args``."""
        return {}

    async def _started(self) -> None:
        """vLLM is up (:attr:`_llm`): set its workers up."""

    def _new_session(self) -> Session:
        """A new session's state."""
        return Session()

    def _response(self, session: str, state: Session, signal: AbortSignal) -> Response[Mark]:
        """One response of ``session`` on ``state``."""
        return ConversationResponse(self, session, state, signal)

    def _allowed_ids(self) -> list[int] | None:
        """The ids a reply may pick (None: any): ``allowed_token_ranges`` and the ends."""
        ranges = self.args.allowed_token_ranges
        if ranges is None:
            return None
        allowed = {i for start, stop in ranges for i in range(start, stop)}
        return sorted(allowed | self.stop_ids)

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the tokenizer (and what :meth:`_load` reads), then start vLLM (tens of
        seconds).

        Files are checked as read (``omni_actors.models.files``); vLLM reads safetensors only."""
        path = self._checkpoint()
        tokenizer = await asyncio.to_thread(load_tokenizer, path)
        self.tokenizer = tokenizer
        self.turns = TurnTemplate.of(tokenizer)
        self.tools = ToolTemplate(tokenizer, self._encode)
        await self._load(path)
        eos = tokenizer.eos_token_id
        self.stop_ids = {self.turns.assistant.suffix[0], *([eos] if eos is not None else [])}
        self.allowed = self._allowed_ids()
        extra = self._engine_args()
        self.runtime = await VllmRuntime.start(
            path,
            {
                "dtype": self.args.dtype,
                "max_model_len": self.args.max_model_len,
                "max_num_seqs": self.args.max_num_seqs,
                "enable_prefix_caching": True,
                "seed": self.args.seed,
                **self.args.engine_args,
                **extra,
            },
            cpu_threads=self.args.cpu_threads,
        )
        self._llm = self.runtime.llm
        self.died = self.runtime.died
        await self._started()

    async def stop(self) -> None:
        """End every request and shut vLLM down (its processes exit)."""
        for session in list(self._sessions):
            await self.abort(session)
        runtime, self.runtime, self._llm = self.runtime, None, None
        if runtime is not None:
            await runtime.stop()

    async def abort(self, session: str) -> None:
        """Drop ``session``: its request is aborted in vLLM, its ``generate`` ends."""
        state = self._sessions.pop(session, None)
        if state is None:
            return
        if state.signal is not None:
            state.signal.abort()
        await state.end_request(abort=True, timeout=self.args.request_timeout_s)

    async def release(self, session: str) -> None:
        """``session`` is over: close its request."""
        state = self._sessions.pop(session, None)
        if state is not None:
            await state.end_request(abort=False, timeout=self.args.request_timeout_s)

    # -- introspection ---------------------------------------------------------------------

    def running_requests(self) -> set[str]:
        """Request ids the engine holds open in vLLM (for tests and ``inspect``)."""
        return {s.request.request_id for s in self._sessions.values() if s.request is not None}

    def unfinished_requests(self) -> int:
        """Requests vLLM itself still tracks (0 once every session ended or aborted)."""
        return 0 if self.runtime is None else self.runtime.unfinished_requests()

    def last_reply(self, session: str) -> tuple[int, ...] | None:
        """The token ids of the reply ``session``'s last ``generate`` decoded.

        A cancelled reply's as far as it was yielded, ``()`` for an empty one (its turn
        is in the conversation); None when that call decoded none (replies taken from
        ``reply`` marks are not counted: the caller has them), failed, still runs, or
        the session is unknown.
        """
        state = self._sessions.get(session)
        return None if state is None else state.decoded

    def prompt_tokens(self, session: str) -> int | None:
        """The tokens the reply of ``session``'s last ``generate`` was decoded after
        (the token list so far, each clip as vLLM expands it: its prompt); None when
        :meth:`last_reply` is None."""
        state = self._sessions.get(session)
        if state is None or state.decoded is None or state.history.reply is None:
            return None
        return state.history.reply.start

    # -- the engine protocol ---------------------------------------------------------------

    def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """One response: prefill its input as it arrives, then stream the reply's tokens.

        The marks and the outcome are
        :func:`~omni_actors.actors.engines.conversation.respond`'s.

        Raises:
            VllmInputError: the session is already generating, bad input, a malformed
                mark or instruction, or a truncation with no reply to cut.
            EngineError: vLLM failed the request (the response fails; the session stays).
        """
        return respond(lambda: self._begin(session), inputs)

    def _begin(self, session: str) -> Response[Mark]:
        """Start a response of ``session``: its state (made on its first)."""
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = self._new_session()
        if state.signal is not None:
            raise VllmInputError(f"session {session!r} is already generating")
        state.signal = AbortSignal()
        state.decoded = None
        return self._response(session, state, state.signal)

    # -- helpers ---------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        # Text is the user's words: a special token's spelling typed in it stays text.
        ids: list[int] = self.tokenizer.encode(
            text, add_special_tokens=False, split_special_tokens=True
        )
        return ids

    def _system_turn(self, text: torch.Tensor | str) -> tuple[int, ...]:
        if not isinstance(text, str):
            raise VllmInputError(f"{INSTRUCTIONS_FIELD!r} must be text (a str), got a tensor")
        if not text:
            return ()
        system = self.turns.system
        return (*system.prefix, *self._encode(text), *system.suffix)

    def _resync(self, state: Session) -> None:
        """After a cut: a request holding tokens the list no longer has is aborted."""
        stale = state.resync()
        if stale is not None:
            self._closing.add(asyncio.get_running_loop().create_task(stale.abort()))
            self._closing = {t for t in self._closing if not t.done()}

    def _sampling(self, max_tokens: int, **fields: Any) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=max_tokens,
            output_kind=RequestOutputKind.DELTA,
            stop_token_ids=sorted(self.stop_ids),
            # Text is decoded here (ReplyText): vLLM's detokenizer would also see the
            # tokens of prefill chunks, which are dropped.
            detokenize=False,
            **fields,
        )

    def _send(self, session: str, state: Session, sampling: Any) -> OpenRequest:
        """Send what the open request lacks of the token list (opening one if needed)."""
        self._resync(state)
        # The counter leads: no id is another's plus vLLM's suffix (hidden_states).
        request_id = f"{next(self._ids)}-{session}"
        return state.send(self._llm, request_id, self.placeholder, sampling)

    async def _prefill(self, session: str, state: Session) -> None:
        """Prefill what is new in the token list now (one token of output, dropped)."""
        if state.fed == len(state.history.tokens):
            return
        request = self._send(session, state, self._sampling(1, temperature=0.0))
        while (out := await state.output(request, self.died)) is not None:
            if out.outputs[0].token_ids:
                await state.take_states(self._llm, request)
                return

    async def _reply(
        self, session: str, state: Session, options: ResponseOptions
    ) -> AsyncIterator[tuple[int, bool]]:
        """The reply's tokens as vLLM generates them: ``(token, is_last)``."""
        max_tokens = options.max_tokens or self.max_new_tokens
        temperature = options.temperature or 0.0
        fields: dict[str, Any] = {
            "temperature": temperature,
            "min_tokens": min(self.min_new_tokens, max_tokens),
        }
        if self.allowed is not None:
            fields["allowed_token_ids"] = self.allowed
        if temperature > 0:
            from omni_actors.actors.engines.qwen3_omni.sampling import session_seed

            fields["seed"] = session_seed(self.args.seed, session) & 0x7FFFFFFF
        request = self._send(session, state, self._sampling(max_tokens, **fields))
        produced = 0
        while True:
            out = await state.output(request, self.died)
            if out is None:
                return
            await state.take_states(self._llm, request)
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            stop = next((i for i, t in enumerate(tokens) if t in self.stop_ids), None)
            if stop is not None:
                tokens = tokens[:stop]
            tokens = tokens[: max_tokens - produced]
            ended = (
                stop is not None
                or completion.finish_reason is not None
                or produced + len(tokens) >= max_tokens
            )
            if ended:
                # vLLM drops a chunk's last sampled token from the request: the end of
                # turn when it stopped there, else the reply's last token (the next
                # chunk feeds it, ahead of the turn's end).
                state.fed += produced + len(tokens) - (0 if stop is not None else 1)
            for i, token in enumerate(tokens):
                last = ended and i == len(tokens) - 1
                yield token, last
            produced += len(tokens)
            if ended:
                return


E = TypeVar("E", bound=VllmConversationEngine)


class ConversationResponse(Response[Mark], Generic[E]):
    """One response of a vLLM conversation engine: the steps of ``respond`` on the
    session's token list (:class:`~.conversation.History`) and its request."""

    def __init__(self, engine: E, session: str, state: Session, signal: AbortSignal) -> None:
        super().__init__(signal, engine.vocab_size)
        self.engine = engine
        self.turns = engine.turns
        self.session = session
        self.state = state
        self.history = state.history
        self.decoding = False
        """This response's reply is open."""

    def checkpoint(self) -> Mark:
        return self.history.checkpoint()

    async def roll_back(self, start: Mark) -> None:
        self.history.restore(start)
        self.engine._resync(self.state)

    # -- input ------------------------------------------------------------------------

    async def instruct(
        self, instructions: torch.Tensor | str | None, tools: torch.Tensor | str | None = None
    ) -> bool:
        history, engine = self.history, self.engine
        now = settings((history.instructions, history.tools), instructions, tools, VllmInputError)
        if now is None:
            return False
        history.instructions, history.tools = now
        try:
            system = engine.tools.system_turn(history.instructions, history.tools)
        except ToolTemplateError as exc:
            raise VllmInputError(str(exc)) from None
        return history.instruct(system or engine._system_turn(history.instructions))

    async def take(self, fields: Fields) -> None:
        history = self.history
        if TOOL_RESULT_FIELD in fields:  # in a chunk with text, before it
            result = _text(TOOL_RESULT_FIELD, fields[TOOL_RESULT_FIELD])
            try:
                ids = self.engine.tools.tool_result(result, first=history.turn_start is None)
            except ToolTemplateError as exc:
                raise VllmInputError(str(exc)) from None
            history.say(ids, self.turns)
        text = fields.get("text")
        if isinstance(text, str):
            history.say(self.engine._encode(text), self.turns)

    def tool_calls_turn(self, message: torch.Tensor | str) -> tuple[int, ...]:
        try:
            return self.engine.tools.tool_calls_turn(_text(TOOL_CALLS_FIELD, message))
        except ToolTemplateError as exc:
            raise VllmInputError(str(exc)) from None

    async def after_input(self, fields: Fields) -> None:
        # A reply is prefilled with what follows it; audio alone was prefilled as far as
        # its whole windows go.
        if fields.get(TURN_FIELD) != "reply" and fields.keys() != {"audio"}:
            await self.engine._prefill(self.session, self.state)

    # -- marks ------------------------------------------------------------------------

    async def commit(self) -> Fields | None:
        self.history.commit(self.turns)
        return None

    async def clear(self, committed: Mark) -> None:
        self.history.clear(committed)
        self.engine._resync(self.state)

    async def truncate(self, kept: int) -> None:
        self.history.truncate(kept, self.turns)
        self.engine._resync(self.state)

    async def take_reply(self, tokens: tuple[int, ...]) -> None:
        self.history.take_reply(tokens, self.turns)

    def encode(self, text: str) -> list[int]:
        return self.engine._encode(text)

    async def instruct_reply(self, instructions: str, tools: str | None = None) -> None:
        engine = self.engine
        try:
            system = engine.tools.system_turn(instructions, tools) if tools else ()
        except ToolTemplateError as exc:
            raise VllmInputError(str(exc)) from None
        self.history.instruct(system or engine._system_turn(instructions))  # no turn is open

    async def drop_instructions(self, before: Mark) -> None:
        reply = self.history.reply if self.decoding else None
        self.history.restore(before)
        if reply is not None:
            self.history.take_reply(reply.tokens, self.turns)
        self.engine._resync(self.state)  # the request holding them ends

    def refused(self, error: TurnMarkError) -> Exception:
        return VllmInputError(str(error))

    # -- the reply --------------------------------------------------------------------

    async def before_reply(self) -> None:
        """Hook, as the reply opens: input held back joins the turn now."""

    def token_fields(self, token: int, first: bool) -> Fields:
        """Hook: what a reply token's output carries besides its id and text (``first``:
        the reply's first token)."""
        return {}

    async def reply(self, options: ResponseOptions) -> AsyncGenerator[Fields, None]:
        engine, history = self.engine, self.history
        await self.before_reply()
        rows = await self.commit()
        if rows is not None:
            yield rows
            if self.signal.aborted:
                return  # no request is sent for a session gone meanwhile
        history.open_reply(self.turns)
        self.decoding, first = True, True
        reply_text = ReplyText(engine.tokenizer)
        async for token, last in engine._reply(self.session, self.state, options):
            out: dict[str, torch.Tensor | str] = {
                "token_ids": torch.tensor([token]),
                "text": reply_text.add(token),
                **self.token_fields(token, first),
            }
            first = False
            history.reply_token(token)
            if last:
                history.end_reply(self.turns)
            yield out
        if self.signal.aborted:
            return
        history.end_reply(self.turns)  # a reply of no token

    # -- settling ---------------------------------------------------------------------

    def end(self) -> None:
        self.state.signal = None

    def held(self) -> bool:
        return self.engine._sessions.get(self.session) is self.state

    def forget(self) -> None:
        """Nothing to do: ``abort`` ends the session's request and frees it."""

    async def finish(self, outcome: Outcome) -> Outcome:
        if self.history.replying:
            # Closed or failed while vLLM still decodes: stop the request; the
            # conversation keeps the tokens yielded, and the next chunk reopens it.
            self.history.end_reply(self.turns)
            await self.state.end_request(abort=True, timeout=self.engine.args.request_timeout_s)
        return outcome

    def keep_reply(self) -> None:
        if self.decoding and self.history.reply is not None:
            self.state.decoded = self.history.reply.tokens


def _text(name: str, value: torch.Tensor | str) -> str:
    if not isinstance(value, str):
        raise VllmInputError(f"{name!r} must be text (a str), got a tensor")
    return value
