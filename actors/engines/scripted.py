"""``ScriptedEngine``: declared latencies and deterministic outputs, no model.

The test harness's engine: a pipeline of scripted stages behaves like a real one in
timing shape (time to first output, time per output), so streaming, deadlines, aborts
and failures can be tested — and benchmarked against the ideal latency computed from
the declared numbers — without weights.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator
from typing import ClassVar, Final, Literal, get_args

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from omni_actors.actors.engines.contract import (
    CONTEXT_FIELD,
    INSTRUCTIONS_FIELD,
    TOOL_CALLS_FIELD,
    TOOL_RESULT_FIELD,
    TOOLS_FIELD,
    Fields,
    Ports,
    Rule,
    response_options,
)
from omni_actors.errors import EngineError

__all__ = ["ScriptedArgs", "ScriptedEngine", "ScriptedEngineError", "reply_pieces"]


class ScriptedEngineError(EngineError):
    """The failure a ``ScriptedEngine`` declared with ``fail_after`` raises."""


def input_rows(fields: Fields) -> int:
    """New rows an input carries: dim 0 of its tensors minus the left context (text: 1)."""
    context_value = fields.get(CONTEXT_FIELD)
    context = int(context_value) if isinstance(context_value, torch.Tensor) else 0
    rows = [
        v.shape[0] if v.dim() else 1
        for k, v in fields.items()
        if isinstance(v, torch.Tensor) and k != CONTEXT_FIELD
    ]
    return max(rows) - context if rows else 1


ScriptedField = Literal["token_ids", "hidden", "codes", "text", "audio"]
_FIELDS: Final[tuple[ScriptedField, ...]] = get_args(ScriptedField)
ScriptedInput = Literal[ScriptedField, "instructions", "tools", "tool_result", "tool_calls"]
"""What a scripted stage may declare it takes: its data fields, and the caller's
conversation settings an entry engine can be declared to follow (taken, then ignored)."""
assert {INSTRUCTIONS_FIELD, TOOLS_FIELD, TOOL_RESULT_FIELD, TOOL_CALLS_FIELD} <= set(
    get_args(ScriptedInput)
)

_PIECE = re.compile(r"\s*\S+|\s+")
"""One text delta of a scripted reply: a word with the whitespace before it (as a BPE
token carries its leading space), or trailing whitespace."""


def reply_pieces(text: str) -> tuple[str, ...]:
    """The text deltas that spell ``text``, in order: they join back to ``text``."""
    return tuple(_PIECE.findall(text))


class ScriptedArgs(BaseModel):
    """A scripted stage's declaration (see :class:`ScriptedEngine`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    first_output_s: float = Field(0.0, ge=0)
    per_output_s: float = Field(0.0, ge=0)
    outputs: int = Field(8, ge=0)
    outputs_per_input: int | None = Field(None, ge=1)
    fields: tuple[ScriptedField, ...] = ("token_ids", "hidden", "text")
    """The fields each output carries (its declared outputs)."""
    inputs: tuple[ScriptedInput, ...] = _FIELDS
    """The fields it takes (its declared inputs): any data field, by default."""
    replace: tuple[str, ...] = ()
    """Fields accumulated by ``replace`` rather than ``concat``, as inputs and outputs."""
    hidden_dim: int = Field(8, ge=1)
    codebooks: int = Field(4, ge=1)
    audio_samples: int = Field(1920, ge=1)  # one 12.5 Hz codec frame of 24 kHz audio
    fail_after: int | None = Field(None, ge=0)
    max_new_tokens: int | None = Field(None, ge=1)
    """An entry stage's most outputs per reply, as a thinker's cap on its tokens (a
    response's ``max_tokens`` overrides it): a longer reply is cut there, and the stage
    reports ``finish_reason: length``. None: replies are never cut, and no cap is told."""
    voices: tuple[str, ...] = ()
    """The voices it speaks with, as a talker declares its speakers (none: it takes any
    ``voice`` option); a response naming another fails as a real talker's would."""
    reply_text: str | None = Field(None, min_length=1)
    """The reply an entry stage spells out: output ``k``'s ``text`` is its ``k``-th piece
    (:func:`reply_pieces`), and it yields one output per piece (``outputs`` follows). A
    pipeline scripts a reply in a model's format with it, a tool call included."""

    @model_validator(mode="after")
    def _check_reply_text(self) -> ScriptedArgs:
        if self.reply_text is None:
            return self
        if "text" not in self.fields:
            raise ValueError("reply_text needs 'text' among fields: it is spelled out as text")
        if self.outputs_per_input is not None:
            raise ValueError(
                "reply_text is an entry stage's reply: drop outputs_per_input, or reply_text"
            )
        pieces = len(reply_pieces(self.reply_text))
        if "outputs" in self.model_fields_set and self.outputs != pieces:
            raise ValueError(
                f"reply_text spells {pieces} outputs but outputs is {self.outputs}: "
                "leave outputs out (it follows reply_text)"
            )
        return self

    @property
    def replies(self) -> int:
        """Outputs an entry stage yields per response."""
        if self.reply_text is not None:
            return len(reply_pieces(self.reply_text))
        return self.outputs


class ScriptedEngine:
    """Produces output ``k`` of a session as ``token_ids=[k]``, ``hidden`` rows of ``k``,
    ``codes`` rows of ``k % 2048``, ``text="t{k} "`` (with ``reply_text``, that text's
    ``k``-th piece) and ``audio`` (``audio_samples`` samples of ``k / 1000``), keeping
    only the fields named in ``fields``.

    Two modes:
        - ``outputs_per_input`` set (a streaming stage such as a talker): every input
          chunk yields that many outputs per new row (dim 0 of its tensors, minus the
          left context a windowed edge adds) as soon as it arrives, so a stage fed one
          whole payload (a ``full`` edge) produces as much as one fed row by row.
        - otherwise (an entry stage such as a thinker): once the input stream ends, it
          yields ``outputs`` outputs (with ``reply_text``, one per piece of it).

    The first output of a session comes ``first_output_s`` after the session's first
    input (or, for entry stages, after its last); each further output ``per_output_s``
    after the previous one. With ``fail_after`` set, a session's generate raises
    :class:`ScriptedEngineError` after that many outputs (an engine failure). With
    ``voices`` set, it reports them (``voices``) and a response whose ``voice`` option
    is not one of them fails with :class:`ScriptedEngineError`.

    It stands in for any engine, so its ports are declared by its arguments: it yields
    ``fields`` and takes ``inputs``, each ``concat`` unless named in ``replace``.

    As an entry stage it counts a conversation as a thinker does: the rows of input it
    took and the outputs it yielded in the session so far are the prompt of its next
    reply (:meth:`prompt_tokens`).

    It is ``Truncatable``: asked to keep ``kept`` outputs of a session's last reply (in
    samples when it yields ``audio``), it answers the input rows those came from.
    """

    kind: ClassVar[str] = "scripted"
    Args: ClassVar[type[ScriptedArgs]] = ScriptedArgs

    @classmethod
    def ports(cls, args: ScriptedArgs) -> Ports:
        """Its declaration, from its arguments (see the class docstring)."""

        def rules(names: tuple[str, ...]) -> dict[str, Rule]:
            return {n: "replace" if n in args.replace else "concat" for n in names}

        return Ports(inputs=rules(args.inputs), outputs=rules(args.fields))

    def __init__(self, args: ScriptedArgs | None = None) -> None:
        self.args = args or ScriptedArgs()
        self._pieces = reply_pieces(self.args.reply_text) if self.args.reply_text else ()
        self._sessions: dict[str, _Pacer] = {}
        self._replies: dict[str, int] = {}  # outputs of each session's last reply
        self._context: dict[str, int] = {}  # rows taken and outputs made, per session
        self._prompts: dict[str, int] = {}  # the context each session's last reply saw
        self._made: dict[int, dict[str, torch.Tensor | str]] = {}
        self.started = False

    @property
    def voices(self) -> list[str] | None:
        """The voices a response's ``voice`` option may name; None when any will do."""
        return list(self.args.voices) or None

    @property
    def voice(self) -> str | None:
        """The voice a response naming none speaks with: the first of ``voices``."""
        return self.args.voices[0] if self.args.voices else None

    @property
    def active_sessions(self) -> set[str]:
        """Sessions with a running ``generate``."""
        return set(self._sessions)

    async def start(self) -> None:
        """Nothing to load."""
        self.started = True

    async def stop(self) -> None:
        """Abort whatever is still running."""
        for pacer in self._sessions.values():
            pacer.abort()
        self.started = False

    async def release(self, session: str) -> None:
        """Forget the session's last reply and its context."""
        self._replies.pop(session, None)
        self._context.pop(session, None)
        self._prompts.pop(session, None)

    async def abort(self, session: str) -> None:
        """End ``session``'s ``generate`` at its next step."""
        self._replies.pop(session, None)
        self._context.pop(session, None)
        self._prompts.pop(session, None)
        pacer = self._sessions.get(session)
        if pacer is not None:
            pacer.abort()

    async def truncate(self, session: str, kept: int) -> int:
        """Input rows that the first ``kept`` outputs (samples, for audio) came from.

        Raises:
            ValueError: the session has no reply.
        """
        made = self._replies.get(session)
        if made is None:
            raise ValueError(f"session {session!r} has no reply to truncate")
        audio = "audio" in self.args.fields
        outputs = min(made, math.ceil(kept / self.args.audio_samples) if audio else kept)
        self._replies[session] = outputs
        per = self.args.outputs_per_input
        return outputs if per is None else math.ceil(outputs / per)

    def prompt_tokens(self, session: str) -> int | None:
        """The context ``session``'s last reply was made from (an entry stage's: the
        rows it took and the outputs it made before it); None before any."""
        return self._prompts.get(session)

    def output(self, k: int) -> dict[str, torch.Tensor | str]:
        """Output number ``k`` of any session (deterministic).

        Made once and shared by every session: like any sent payload, never mutated, and
        building tensors per step would make the test engine dearer than what it tests.
        """
        made = self._made.get(k)
        if made is None:
            made = self._make(k)
            if len(self._made) < _CACHED:
                self._made[k] = made
        return dict(made)

    def _make(self, k: int) -> dict[str, torch.Tensor | str]:
        made: dict[str, torch.Tensor | str] = {}
        for name in self.args.fields:
            if name == "token_ids":
                made[name] = torch.tensor([k])
            elif name == "hidden":
                made[name] = torch.full((1, self.args.hidden_dim), float(k))
            elif name == "codes":
                made[name] = torch.full((1, self.args.codebooks), k % 2048)
            elif name == "text":
                pieces = self._pieces
                made[name] = pieces[k % len(pieces)] if pieces else f"t{k} "
            else:
                made[name] = torch.full((self.args.audio_samples,), k / 1000)
        return made

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        """See the class docstring."""
        if session in self._sessions:
            raise ValueError(f"session {session!r} is already generating")
        pacer = self._sessions[session] = _Pacer(asyncio.get_running_loop())
        produced = 0
        replies = self._replies
        replies[session] = 0
        args = self.args
        try:
            if args.outputs_per_input is None:
                async for item in inputs:
                    if pacer.aborted:
                        return
                    self._context[session] = self._context.get(session, 0) + input_rows(item)
                pacer.input_taken()
                context = self._prompts[session] = self._context.get(session, 0)
                for _ in range(self._reply_length(inputs)):
                    if await pacer.wait(self._delay(produced)):
                        return
                    produced += 1
                    replies[session] = produced  # counted once handed out
                    self._context[session] = context + produced
                    yield self.output(produced - 1)
            else:
                async for item in inputs:
                    pacer.input_taken()
                    self._check_voice(inputs)
                    for _ in range(args.outputs_per_input * input_rows(item)):
                        if await pacer.wait(self._delay(produced)):
                            return
                        produced += 1
                        replies[session] = produced
                        yield self.output(produced - 1)
        finally:
            del self._sessions[session]

    @property
    def max_new_tokens(self) -> int | None:
        """A reply's most outputs when its response sets none (``max_new_tokens``)."""
        return self.args.max_new_tokens

    def _reply_length(self, inputs: AsyncIterator[Fields]) -> int:
        """The outputs of an entry stage's reply: ``replies``, cut at its cap if any."""
        args = self.args
        if args.max_new_tokens is None:
            return args.replies
        return min(args.replies, response_options(inputs).max_tokens or args.max_new_tokens)

    def _check_voice(self, inputs: AsyncIterator[Fields]) -> None:
        voice = response_options(inputs).voice
        if voice is not None and self.args.voices and voice not in self.args.voices:
            raise ScriptedEngineError(
                f"unknown voice {voice!r}: the voices are {', '.join(self.args.voices)}"
            )

    def _delay(self, produced: int) -> float:
        """How long after the previous one output ``produced`` is due."""
        args = self.args
        if args.fail_after is not None and produced >= args.fail_after:
            raise ScriptedEngineError(f"scripted failure after {produced} outputs")
        return args.first_output_s if produced == 0 else args.per_output_s


_CACHED = 4096  # outputs kept per engine


class _Pacer:
    """One session's schedule: each output is due ``delay`` after the previous one was
    due, or after the input it answers was taken if that came later.

    Due times are absolute, so a late wake-up does not push every later output back:
    the engine keeps exactly the timing its declaration promises (what the benchmark's
    ideal latency assumes), and abort wakes it at once.
    """

    __slots__ = ("_due", "_loop", "_waiter", "aborted")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop  # the session's generate runs on it: looked up once, not per step
        self._due = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self.aborted = False

    def input_taken(self) -> None:
        self._due = max(self._due, self._loop.time())

    async def wait(self, delay: float) -> bool:
        if self.aborted:
            return True
        loop = self._loop
        self._due += delay
        if self._due > loop.time():
            waiter = self._waiter = loop.create_future()
            timer = loop.call_at(self._due, _resolve, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return self.aborted

    def abort(self) -> None:
        self.aborted = True
        if self._waiter is not None:
            _resolve(self._waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
