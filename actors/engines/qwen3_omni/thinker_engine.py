"""``ThinkerEngine``: Qwen3-Omni's thinker as a conversation engine.

The entry stage: it answers the user's text and audio with text tokens plus what the
talker needs to speak them. Each ``generate`` call is one response of a conversation
whose KV cache the engine keeps per session (:class:`~.conversation.Conversation`).
Input is prefilled *while it arrives* (:class:`~.user_turn.UserTurn`: text per chunk,
audio per encoder window), so when the input ends only its tail is left to compute and
the first token comes quickly, however long the user spoke. The talker's rows of what
was prefilled go out at once too (``Response.ahead``, with ``user_edits``): the talker
prefills the turn while it is spoken; a ``clear`` takes them back, and a truncation
that feeds the open turn again behind the cut reply sends its new rows in their place.

The input (user turns and turn marks), the checkpoints a response keeps and how its
outcome settles the conversation are the conversation engines' state machine
(:func:`~omni_actors.actors.engines.conversation.respond`); here each is done to the KV
cache: a ``clear`` and a failure crop it back to a checkpoint, a truncation into the
reply, and a ``reply`` mark is one forward that leaves the cache, the carry and the
:class:`~.conversation.ThinkerReply` as decoding the mark's tokens did (the talker
conditions on user turns only: nothing is yielded for it). The end of the input commits
what is pending, then the reply opens (``<|im_start|> assistant \\n``) and decodes; with
no input at all, it replies to the conversation so far. :meth:`ThinkerEngine.last_reply`
tells the session the tokens of the reply the last response decoded, to replay it later.

The end of input commits the open turn: its rows went to the talker as it was
prefilled, so one forward over its tail, ``<|im_end|> \\n`` and the reply's opening
picks the first token, which carries the tail's rows. That forward is all the work
between the end of the input and the first token. A one-shot text prompt (the reply
asked for with it) shares that forward with the reply's opening; its rows are its input
embeddings, which no forward changes, so they leave before the forward (``rows_ahead``)
and the talker prefills them meanwhile. A response closed (``aclose``) at
rows of its open turn sent ahead while its input went on leaves the turn committed
without a reply: its rows are the talker's already (the rows of its tail, computed on
closing, are not sent); a stage closes a response only once its input has ended. A
decode step in flight when the reply ends is waited for, so the cache holds exactly the
tokens yielded.

Instructions (``INSTRUCTIONS_FIELD``, a system prompt) set the conversation's
instructions from then on as a system turn (``conversation``): prefilled at once when
no user turn is open, else right behind the open turn when it is committed (by a mark
or by the end of input, in the forward that closes it); a later instruction replaces
one still waiting, and an empty one sets none. In a chunk with text or audio they come
first. A system turn stays through a ``clear`` (one waiting behind a cleared turn is
prefilled then), a truncation (fed again behind the cut reply) and a failed response
(the last instructions it set are fed again before whatever comes next): they are the
caller's setting, not the reply's. No row of a system turn goes to the talker.

Tools (``TOOLS_FIELD``) are the instructions' companions: the system turn is rendered
from the last of each by the release's chat template (:class:`~..tool_template.ToolTemplate`,
Qwen's ``# Tools`` block), and set as instructions are. A tool's result
(``TOOL_RESULT_FIELD``) joins the open user turn as the template writes a ``tool``
message there, and a ``reply`` mark giving back a turn that called tools
(``TOOL_CALLS_FIELD``) is taken as the template writes that turn.

A response's own instructions (``ResponseOptions.instructions``, with its own tools,
``ResponseOptions.tools``) are a system turn fed right before its reply; once the reply
is kept, the cache is cropped back to where they were fed and the reply's tokens are
fed again there, as a ``reply`` mark feeds them (one forward), so later turns see the
reply and not them.

Tokens are greedy unless a response asks for a temperature (see ``sampling``).

Every forward is work on the engine's :class:`~omni_actors.actors.engines.step_loop.StepLoop`:
each step runs one decode row of every decoding session and prefill chunks of the
sessions whose input is being prefilled, in one forward over the
:class:`~.slot_cache.SlotCache`, the only KV cache (one slot per session, held from its
first response to its release; a session that finds no free slot fails with
:class:`~omni_actors.actors.engines.step_loop.SlotsExhaustedError`). Each session still
picks with its own sampling and generator. A row's logits in a step of several may
differ from the session's alone in the last bits (other matmul shapes): tests compare
tokens. What a forward's result changes in the conversation (its carry, the turn's rows)
is applied when the step's update resolves the work, also when the response that asked
for it was cancelled meanwhile: the cache and the conversation never disagree.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import ClassVar

import torch
from pydantic import Field

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    TOOL_CALLS_FIELD,
    TOOL_RESULT_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
    Rule,
)
from omni_actors.actors.engines.conversation import Outcome, respond, settings
from omni_actors.actors.engines.qwen3_omni.conversation import Conversation
from omni_actors.actors.engines.qwen3_omni.conversation_engine import (
    ConversationEngine,
    ConversationResponse,
)
from omni_actors.actors.engines.qwen3_omni.family import DEFAULT_RELEASE
from omni_actors.actors.engines.qwen3_omni.frame_compile import (
    ThinkerCompileArgs,
    end_compile_workers,
)
from omni_actors.actors.engines.qwen3_omni.moe import MoeArgs
from omni_actors.actors.engines.qwen3_omni.sampling import Sampling, sampling_for, session_seed
from omni_actors.actors.engines.qwen3_omni.slot_cache import DecodeAttentionArgs
from omni_actors.actors.engines.qwen3_omni.static_decode import PrefillGraphArgs
from omni_actors.actors.engines.qwen3_omni.thinker_model import (
    Fed,
    Feeding,
    Pick,
    ThinkerChunk,
    ThinkerModel,
)
from omni_actors.actors.engines.qwen3_omni.user_turn import Feed, UserTurn
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.actors.engines.stepped_engine import StepLoopArgs
from omni_actors.actors.engines.thinker_ports import THINKER_INPUTS, THINKER_OUTPUTS
from omni_actors.actors.engines.tool_template import ToolTemplate
from omni_actors.actors.engines.torch_engine import AbortSignal, DeviceArgs, release_dir
from omni_actors.models.family import WeightsArgs

__all__ = ["ThinkerArgs", "ThinkerEngine", "load_model"]


class ThinkerArgs(
    WeightsArgs,
    DeviceArgs,
    PrefillGraphArgs,
    DecodeAttentionArgs,
    ThinkerCompileArgs,
    StepLoopArgs,
    MoeArgs,
):
    """The thinker's arguments: ``seed`` and ``cache_dir`` locate its weights; ``moe``
    picks its experts' forward (:class:`MoeArgs`).

    The KV cache is planned at load: ``max_sessions`` slots of ``max_context``
    positions; the steps' sizes are :class:`StepLoopArgs`'. ``static_cache`` (None: on a
    GPU) replays decode-only steps from CUDA graphs, captured at load with
    ``warm_graphs``, their layers compiled first (:class:`ThinkerCompileArgs`: on a GPU
    by default, prefill forwards' layers too), and a session's first prompt replays a
    fresh prefill graph of its length (:class:`PrefillGraphArgs`: on by default there).

    Attributes:
        max_new_tokens: a reply's most tokens (a response's ``max_tokens`` overrides it).
        min_new_tokens: ``<|im_end|>`` is masked until that many tokens exist; capped
            at the reply's maximum (setting only a small maximum means "at most that
            many", not a conflict).
        allowed_token_ranges: half-open ``[start, stop)`` id ranges a reply may use
            (``<|im_end|>`` is allowed once ``min_new_tokens`` are reached); none: any.
            For a model whose random weights would pick unprintable ids (tiny-omni:
            printable bytes only). The vLLM thinker's argument of the same name.
        rows_ahead: a text prompt asked to be answered with it (a one-shot request)
            sends its talker rows (its input embeddings) before its forward, so that
            the talker prefills them while that forward waits and runs; False: with the
            first token, in the talker's one forward with the reply's opening (where
            both stages share one GPU, their two prefills do not run at once).
        prefill_rows: the most decode rows a fresh prefill graph runs in its forward,
            beside the first prompts (capped by ``max_batch``); 0: a step's decode rows
            run as a forward of their own beside the replay. Riding along, they do not
            read the experts' weights again: a step of three 2500-position prompts took
            15-28 ms longer with 8-32 decode rows apart (two H200s, full size).
    """

    max_new_tokens: int = Field(48, ge=1)
    min_new_tokens: int = Field(8, ge=0)
    allowed_token_ranges: list[tuple[int, int]] | None = None
    rows_ahead: bool = Field(True, strict=True)
    prefill_rows: int = Field(32, ge=0)


def load_model(
    path: Path, device: torch.device, args: ThinkerArgs, *, warm: bool | None = None
) -> ThinkerModel:
    """The thinker's model at ``path`` on ``device``, built as :class:`ThinkerEngine`
    builds it from ``args``; ``warm`` False captures no graph at load (each shape is
    captured at its first step, or by the caller), None as ``warm_graphs`` says."""
    graphs = args.graphs_on(device)
    return ThinkerModel(
        path,
        device,
        allowed_token_ranges=args.allowed_token_ranges,
        slots=args.max_sessions,
        max_context=args.max_context,
        max_rows=args.max_batch,
        graphs=graphs,
        warm=graphs and (args.warm_graphs if warm is None else warm),
        moe=args.moe,
        moe_combine=args.moe_combine,
        compile_layers=args.decode_compile(device),
        compile_prefill=args.prefill_compile(device),
        prefill_graphs=args.prefill_graphs_on(device),
        prefill_bucket=args.prefill_bucket,
        prefill_batch=args.prefill_batch,
        step_tokens=args.max_tokens_per_step,
        prefill_rows=args.prefill_rows,
        decode_attention=args.decode_attention,
    )


class ThinkerEngine(ConversationEngine[Feeding, Fed]):
    """Text replies with streaming prefill (see the module docstring).

    Its ports are the thinker stage's (:mod:`omni_actors.actors.engines.thinker_ports`): a
    token's ``text`` is what it adds to the reply's text (``""`` while it leaves a
    character incomplete; what is held back at the reply's end comes as a last output
    with ``text`` alone), and the ``user`` rows at audio
    placeholders are the hidden states at ``accept_hidden_layer``, what
    ``stepping.talker_user_part`` selects from.

    Args:
        args: see :class:`ThinkerArgs`.

    Raises:
        ModelNotPreparedError: the weights are not prepared.
    """

    kind: ClassVar[str] = "qwen3-omni.thinker"
    Args: ClassVar[type[ThinkerArgs]] = ThinkerArgs
    inputs: ClassVar[Mapping[str, Rule]] = THINKER_INPUTS
    outputs: ClassVar[Mapping[str, Rule]] = THINKER_OUTPUTS
    streams_input: ClassVar[bool] = True

    def __init__(self, args: ThinkerArgs) -> None:
        self.max_new_tokens = args.max_new_tokens
        self.rows_ahead = args.rows_ahead
        self.min_new_tokens = min(args.min_new_tokens, args.max_new_tokens)
        self.seed = args.seed
        self.allowed_token_ranges = args.allowed_token_ranges
        self._args = args
        super().__init__(
            release_dir(DEFAULT_RELEASE, args, "thinker"),
            "thinker",
            args.device,
            args=args,
            max_context=args.max_context,
        )
        # A fresh prompt split by the step's budget would replay its graph for the first
        # part and run the rest as an eager forward, a forward's fixed cost for a part.
        self.loop.whole_fresh_prefills = args.prefill_graphs_on(self.device)

    def _load(self, path: Path) -> None:
        self._model = load_model(path, self.device, self._args)
        self.close_turn = self._model.vocabulary.close_turn
        self.assistant_opening = self._model.vocabulary.assistant_opening

    def _step(self, chunks: list[ThinkerChunk]) -> list[Fed]:
        return self._model.step(chunks)

    async def stop(self) -> None:
        """Stop the step loop and the model thread, then the compile workers its decode
        and prefill compiles started (:func:`~.frame_compile.end_compile_workers`)."""
        await super().stop()
        model: ThinkerModel | None = getattr(self, "_model", None)
        if model is not None and (model.compiled, model.prefill_compiled) != ("off", "off"):
            end_compile_workers()

    @property
    def eager_steps(self) -> int | None:
        """Decode-only steps run eager for want of a graph (:attr:`ThinkerModel.eager_steps`);
        None on the CPU, with ``static_cache`` off, or before the model is loaded."""
        model: ThinkerModel | None = getattr(self, "_model", None)
        return None if model is None else model.eager_steps

    @property
    def vocabulary(self) -> Vocabulary:
        """The loaded release's tokenizer and special ids (once started)."""
        return self._model.vocabulary

    @functools.cached_property
    def tools(self) -> ToolTemplate:
        """The tool pieces of the release's chat template (once started)."""
        vocabulary = self.vocabulary
        return ToolTemplate(vocabulary.tokenizer, vocabulary.encode, remedy=_TOOLS_REMEDY)

    def _system_turn(self, instructions: str, tools: str) -> tuple[int, ...]:
        """The system turn of ``instructions`` with ``tools`` (none: as without)."""
        return self.tools.system_turn(instructions, tools) or _system_turn(
            self.vocabulary, instructions
        )

    # -- introspection -------------------------------------------------------------------

    def cached_tokens(self, session: str) -> int:
        """Positions in ``session``'s KV cache (0 when it has no state)."""
        conversation = self._sessions.get(session)
        return 0 if conversation is None else conversation.position

    # -- the engine protocol --------------------------------------------------------------

    def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """One response: prefill its input as it arrives, then decode one token per output.

        Input fields per chunk: ``text`` (str) and/or ``audio`` (float32 1-D, 16 kHz
        mono; in a chunk with both, the audio comes first), ``instructions`` (str; before
        either), or a turn mark (a ``reply`` mark's ``REPLY_FIELD``: a 1-D integer tensor
        of token ids). Outputs: see the class docstring. The marks and the outcome are
        :func:`~omni_actors.actors.engines.conversation.respond`'s.

        Raises:
            ValueError: the session is already generating, a mark is malformed (a reply
                mark's ids outside the vocabulary among it), a truncation has no reply to
                cut, instructions are not text, or the options are out of range.
        """
        return respond(lambda: self._respond(session), inputs)

    def _response(self, session: str, conversation: Conversation, signal: AbortSignal) -> _Response:
        return _Response(self, session, conversation, signal)

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
        conversation.truncate(kept, self.vocabulary.close_turn)
        return 0

    def _generator(self, session: str, conversation: Conversation) -> torch.Generator:
        if conversation.generator is None:
            seed = session_seed(self.seed, session)
            conversation.generator = torch.Generator().manual_seed(seed)
        return conversation.generator


class _Response(ConversationResponse[Feeding, Fed]):
    """One response of the thinker: the steps of ``respond`` on the session's
    :class:`Conversation` and on the user turn being received (:class:`UserTurn`)."""

    engine: ThinkerEngine

    def __init__(
        self, engine: ThinkerEngine, session: str, conversation: Conversation, signal: AbortSignal
    ) -> None:
        super().__init__(
            engine, session, conversation, signal, engine._model.text_config.vocab_size
        )
        self.model = engine._model
        self.vocabulary = engine.vocabulary
        self.turn = UserTurn(self.vocabulary)

    def _feeding(self, ids: list[int]) -> Feeding:
        return Feeding(ids)

    def _pick(self, out: Fed) -> int:
        assert out.token is not None, "a step that picks gives a token"
        return out.token[0]

    def _drop_turn(self) -> tuple[int, ...]:
        waiting = self.turn.system
        # The talker's rows of the dropped turn go with the next output (``ahead``).
        self.turn = UserTurn(self.vocabulary, ahead=self.turn.ahead.dropped())
        return waiting

    # -- forwards: work on the engine's step loop ---------------------------------------

    async def _prefill(
        self, turn: UserTurn, end_clip: bool, then: list[int], tail: int = 0
    ) -> None:
        """Prefill the turn's pending ids, its clip's new windows (all of the clip if
        ``end_clip``), then ``then``, whose last ``tail`` ids are not the user's."""
        embeds = None
        if turn.clip is not None:
            embeds = await self.engine.call(self.model.audio, turn, end_clip)
        if embeds is None and not end_clip and not then:
            return  # the clip's log-mel advanced, no window is whole yet
        feed = turn.next_feed(embeds, end_clip, then, tail)
        if feed.ids:
            await self._feed_turn(turn, feed)

    async def _feed_turn(self, turn: UserTurn, feed: Feed, pick: Pick | None = None) -> Fed | None:
        """One feed of the turn; its talker rows go to the turn. The last chunk's output
        (None if the session was aborted meanwhile)."""
        outputs = await self._feed(*self._turn_feeding(turn, feed, pick))
        return outputs[-1] if outputs else None

    def _turn_feeding(
        self, turn: UserTurn, feed: Feed, pick: Pick | None = None, *, kept: bool = False
    ) -> tuple[Feeding, Callable[[list[Fed]], None]]:
        """The work of one feed of the turn, and what its outputs do to the turn
        (``kept``: the turn holds the feed's rows already, text's, taken before it)."""
        conversation = self.conversation
        audio_pad = self.vocabulary.ids.audio_pad

        def then(outputs: list[Fed]) -> None:
            if feed.skip:
                conversation.carry = []
            if kept:
                return
            rows = [fed.rows for fed in outputs if fed.rows is not None]
            placeholders = torch.tensor(feed.ids) == audio_pad
            turn.keep(feed, rows[0] if len(rows) == 1 else self.model.cat_rows(rows), placeholders)

        return Feeding(feed.ids, feed.audio, rows=not kept, pick=pick), then

    async def _open_reply(self, turn: UserTurn | None, sampling: Sampling) -> Fed | None:
        """Close ``turn`` if one is open, open the reply, pick its first token (the
        output that picked it; None if the session was aborted meanwhile).

        One feed of what the turn still has pending (its clip's last window among it),
        ``<|im_end|> \\n``, the system turn set while it was open if any, then
        ``<|im_start|> assistant \\n``: the only work left between the end of the input
        and the first token. Without a turn it feeds the carry and the opening.
        """
        conversation, opening = self.conversation, self.vocabulary.assistant_opening
        choice = Pick(sampling.min_tokens == 0, sampling)
        if turn is None:

            def then(_: list[Fed]) -> None:
                conversation.carry = []

            outputs = await self._feed(Feeding([*conversation.carry, *opening], pick=choice), then)
            fed = outputs[-1] if outputs else None
        else:
            embeds = None
            if turn.clip is not None:
                embeds = await self.engine.call(self.model.audio, turn, True)
            then_ids = [*self.vocabulary.close_turn, *turn.system, *opening]
            tail = len(turn.system) + len(opening)
            fed = await self._feed_turn(turn, turn.next_feed(embeds, True, then_ids, tail), choice)
        if fed is None:
            return None
        assert fed.token is not None, "opening a reply picks its first token"
        return fed

    # -- input ------------------------------------------------------------------------

    async def instruct(
        self, instructions: torch.Tensor | str | None, tools: torch.Tensor | str | None = None
    ) -> bool:
        conversation = self.conversation
        now = settings((conversation.instructions, conversation.tools), instructions, tools)
        if now is None:
            return False
        conversation.instructions, conversation.tools = now
        self.instructed = self.engine._system_turn(conversation.instructions, conversation.tools)
        if self.turn.opened:
            self.turn.system = self.instructed  # prefilled behind the turn's end
            return False
        if not self.instructed:
            return False
        await self._instruct(self.instructed)
        return True

    async def take(self, fields: Fields) -> None:
        """Add one input chunk to the user turn, prefilling what can be prefilled now."""
        conversation, turn = self.conversation, self.turn
        audio = fields.get("audio")
        text = fields.get("text")
        ids: list[int] = []
        if TOOL_RESULT_FIELD in fields:  # in a chunk with text, before it
            result = _text(TOOL_RESULT_FIELD, fields[TOOL_RESULT_FIELD])
            ids += self.engine.tools.tool_result(result, first=not turn.opened)
        if isinstance(text, str) and text:
            ids += await self.vocabulary.encode_apart(text)
        heard = isinstance(audio, torch.Tensor) and audio.numel() > 0
        said = bool(ids)
        if not (heard or said):
            return
        turn.open(conversation.carry)
        if isinstance(audio, torch.Tensor) and heard:
            if turn.clip is None:
                turn.clip = self.model.clip()
            turn.clip.push(audio.detach().to(torch.float32).reshape(-1).cpu().numpy())
        if said and turn.clip is None and self.last_input:
            # Deferred: the reply (asked for with it, as a one-shot request asks) opens
            # in the same forward as this text. The text's rows are its input embeddings,
            # which need no forward: they go to the talker now (``ahead``), so that it
            # prefills the turn while this forward waits for its step and runs, not
            # after the first token.
            feed = turn.next_feed(None, True, ids, 0)
            if not self.engine.rows_ahead or self.vocabulary.ids.audio_pad in feed.ids:
                self._defer(*self._turn_feeding(turn, feed))  # rows with the first token
                return
            rows = self.model.text_rows(feed.ids)  # not behind the model thread's step
            turn.keep(feed, rows, torch.zeros(len(feed.ids), dtype=torch.bool))
            self._defer(*self._turn_feeding(turn, feed, kept=True))
        elif said:
            await self._prefill(turn, True, ids)
        elif turn.clip is not None and turn.clip.ready() and not self.last_input:
            # (The last input's windows are encoded with the clip's end, at the reply's
            # opening: one encoder call and one forward.)
            await self._prefill(turn, False, [])

    async def after_input(self, fields: Fields) -> None:
        if fields.get(TURN_FIELD) == "truncate":
            # The cut cropped the cache under what the open turn prefilled: feed that
            # again behind the new carry (after ``committed`` was taken without it).
            replay = self.turn.replay(self.conversation.carry)
            if replay is not None:
                await self._feed_turn(self.turn, replay)

    # -- marks ------------------------------------------------------------------------

    async def commit(self) -> Fields | None:
        rows = await self._close(self.turn)
        self.turn = UserTurn(self.vocabulary)
        return rows

    def ahead(self) -> Fields | None:
        return self.turn.take_rows(self.model.cat_rows)

    def moved_start(self) -> None:
        self.instructed = self.turn.system  # those fed already are in the carry

    def tool_calls_turn(self, message: torch.Tensor | str) -> tuple[int, ...]:
        return self.engine.tools.tool_calls_turn(_text(TOOL_CALLS_FIELD, message))

    def encode(self, text: str) -> list[int]:
        return self.vocabulary.encode(text)

    async def instruct_reply(self, instructions: str, tools: str | None = None) -> None:
        system = (
            self.engine._system_turn(instructions, tools)
            if tools is not None
            else _system_turn(self.vocabulary, instructions)
        )
        await self._instruct(system)

    async def _close(self, turn: UserTurn) -> Fields | None:
        """Commit ``turn`` (nothing if it is not open); its rows as an output."""
        if not turn.opened:
            return None
        then, system = [*self.vocabulary.close_turn, *turn.system], len(turn.system)
        await self._prefill(turn, True, then, system)
        self.conversation.turns_since_reply += 1
        return turn.take_rows(self.model.cat_rows)

    # -- the reply --------------------------------------------------------------------

    async def reply(self, options: ResponseOptions) -> AsyncGenerator[Fields, None]:
        engine, conversation, signal = self.engine, self.conversation, self.signal
        sampling = sampling_for(
            options,
            max_new_tokens=engine.max_new_tokens,
            min_new_tokens=engine.min_new_tokens,
            generator=lambda: engine._generator(self.session, conversation),
        )
        # The end of input commits the open turn: what it prefilled is the talker's
        # already (``ahead``), the rest comes with the first token, from the one forward
        # left.
        closing = self.turn if self.turn.opened else None
        opened = await self._open_reply(closing, sampling)
        if opened is None:
            return  # aborted
        last_rows = None if closing is None else closing.take_rows(self.model.cat_rows)
        text, first = self.vocabulary.detokenizer(), True
        tokens = self._decode(
            opened,
            end=self.vocabulary.ids.im_end,
            max_tokens=sampling.max_tokens,
            min_tokens=sampling.min_tokens,
            decode=lambda token, allow_end: Feeding([token], pick=Pick(allow_end, sampling)),
        )
        async with aclosing(tokens):
            async for token, fed in tokens:
                assert fed.token is not None, "a step that picks gives a token"
                out: dict[str, torch.Tensor | str] = {
                    "token_ids": torch.tensor([token]),
                    "text": text.add(token),
                    "embed": fed.token[1],
                }
                if first:
                    out.update(last_rows or {})
                    out["opening"] = self.model.opening
                    out["tts"] = self.model.tts
                    first = False
                yield out
        if (rest := text.flush()) and not signal.aborted:
            yield {"text": rest}

    # -- settling ---------------------------------------------------------------------

    async def finish(self, outcome: Outcome) -> Outcome:
        if outcome == "cancelled" and not self.decoding and self.turn.opened:
            # Closed at rows of the open turn sent ahead: they are the talker's now, so
            # the turn stays, committed without a reply.
            try:
                await self._close(self.turn)
            except Exception:
                outcome = "failed"
            except BaseException:
                del self.engine._sessions[self.session]
                raise
        return await super().finish(outcome)


_TOOLS_REMEDY = "omni-actors prepare tiny-omni --force rebuilds tiny-omni with one"


def _text(name: str, value: torch.Tensor | str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name!r} must be text (a str), got a tensor")
    return value


def _system_turn(vocabulary: Vocabulary, text: torch.Tensor | str) -> tuple[int, ...]:
    if not isinstance(text, str):
        raise ValueError(f"{INSTRUCTIONS_FIELD!r} must be text (a str), got a tensor")
    return vocabulary.system_turn(text)
