"""``respond``: one response of a conversation engine, the state machine every one shares.

An engine that keeps a conversation (tiny-omni's torch thinker, the ``vllm`` kind) serves
each ``generate`` call as one response of it (:mod:`~omni_actors.actors.engines.contract`):
it reads the response's input, turn marks among it, then replies. What that does to the
conversation is the same whatever the engine and is written here once, by
:func:`respond`; what it does to the engine's state (a KV cache and the user turn being
prefilled, a token list and the vLLM request that holds it) is the engine's
:class:`Response`, a small set of steps the state machine calls.

**Input**, chunk by chunk, in order:

- plain input: ``instructions`` and ``tools`` (:data:`~.contract.INSTRUCTIONS_FIELD`,
  :data:`~.contract.TOOLS_FIELD`: the conversation's system turn from then on, each
  kept until it is set again), then text, audio and tool results
  (:data:`~.contract.TOOL_RESULT_FIELD`), which join the open user turn (the first of
  them opens one);
- ``commit``: the open user turn is closed; its rows (what the talker conditions on)
  are yielded, those not sent ahead of it;
- ``clear``: what came since the last commit is dropped: the conversation comes back to
  the ``committed`` checkpoint;
- ``truncate``: the last reply is cut to its first ``kept`` outputs
  (:func:`~.turn_marks.kept_of`; :func:`~.turn_marks.check_truncatable` says when);
- ``reply``: an assistant turn generated earlier (a session replaying its conversation),
  or given by its text (:meth:`Response.encode`: a history the caller holds): the open
  user turn is committed (its rows yielded), then the reply's tokens
  (:func:`~.turn_marks.reply_of`) are taken as if decoded; nothing is yielded for them.
  A given assistant turn that called tools carries them instead
  (:data:`~.contract.TOOL_CALLS_FIELD`, with its words): its tokens are the turn as the
  chat template writes it (:meth:`Response.tool_calls_turn`);
- any other mark is refused (:class:`~.turn_marks.TurnMarkError`).

After each chunk, what the engine sends ahead of the commit is yielded
(:meth:`Response.ahead`): the open turn's rows as they become final, so the talker
prefills the turn while it is spoken, and, once the turn was cleared (or fed again by
a truncation), the output that takes back the rows it had sent
(:data:`~.thinker_ports.USER_EDITS_FIELD`).

**Two checkpoints.** ``start`` is where the response began: a failure comes back to it.
``committed`` is the conversation as the last mark left it (or instructions fed between
user turns: a clear keeps them): a ``clear`` comes back to it. Every mark moves
``committed`` to where it left the conversation. A truncation that cuts a reply from
before the response (not one a ``reply`` mark took back since ``start``) moves ``start``
there too: the cut part is gone, so a failure can only come back to the cut (what the
user heard stays what they heard); a reply taken back in the same input goes with a
rollback, cut or not.

**The reply.** When the input ends the reply opens, closing the open user turn if any
(its rows go out first), and streams (:meth:`Response.reply`).

**A response's own instructions** (``ResponseOptions.instructions``, and its own tools,
``ResponseOptions.tools``) hold for its reply alone. The open user turn is committed (as
a ``commit`` mark commits it), they are fed as a system turn
(:meth:`Response.instruct_reply`), and the reply follows them. Once
the reply is kept (``done`` or ``cancelled``), the conversation comes back to where
they were fed and takes the reply in again as a ``reply`` mark takes one
(:meth:`Response.drop_instructions`): it then holds the reply as if they had never been
given, the state a replay of the conversation rebuilds. A failure rolls them back with
the rest.

**The outcome** settles the conversation:

- ``done``: the reply ended; the conversation keeps it.
- ``cancelled``: the caller closed the response at a ``yield`` (``aclose``, a
  barge-in); the conversation keeps the reply as far as it was yielded.
- ``failed``: the response raised, or the caller raised an error in it at a ``yield``
  (``athrow``: an output it could not take); the conversation comes back to ``start``
  and the session goes on.
- ``dropped``: the session was aborted (:class:`~.torch_engine.AbortSignal`) or the
  response's task cancelled: the session is forgotten. A cancel because the first
  output was overdue (:func:`~.contract.output_overdue`) is ``failed`` instead: that
  reply alone failed, as a crash would.

The engine ends the response first (:meth:`Response.end`: the session may take another),
then settles it. A session whose state the engine no longer holds (aborted meanwhile,
perhaps started again) is dropped whatever the outcome.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Generic, Literal, Protocol, TypeVar

import torch

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    TOOL_CALLS_FIELD,
    TOOLS_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
    output_overdue,
    response_options,
)
from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.actors.engines.turn_marks import TurnMarkError, kept_of, reply_of

__all__ = ["Checkpoint", "Outcome", "Response", "respond", "settings"]

Outcome = Literal["done", "cancelled", "failed", "dropped"]
"""How a response ended (module docstring)."""


def settings(
    current: tuple[str, str],
    instructions: torch.Tensor | str | None,
    tools: torch.Tensor | str | None,
    error: type[ValueError] = ValueError,
) -> tuple[str, str] | None:
    """The conversation's (instructions, tools) after an input that sets them: each kept
    until set again. None for the same tools again without instructions: the system turn
    stands, nothing is fed.

    Raises:
        error: a value is not text.
    """

    def text(name: str, value: torch.Tensor | str) -> str:
        if not isinstance(value, str):
            raise error(f"{name!r} must be text (a str), got a tensor")
        return value

    kept_instructions, kept_tools = current
    if instructions is None and tools is not None and text(TOOLS_FIELD, tools) == kept_tools:
        return None
    return (
        kept_instructions if instructions is None else text(INSTRUCTIONS_FIELD, instructions),
        kept_tools if tools is None else text(TOOLS_FIELD, tools),
    )


class Checkpoint(Protocol):
    """What :func:`respond` reads of an engine's checkpoint: the last reply at the time.

    Compared by identity: a reply that is cut or taken back is another object.
    """

    @property
    def reply(self) -> object:
        """The conversation's last reply when the checkpoint was taken (None: none)."""
        ...


C = TypeVar("C", bound=Checkpoint)


class Response(ABC, Generic[C]):
    """An engine's side of one response: the steps :func:`respond` takes on its state.

    A subclass holds the session's state (kept by the engine across responses) and what
    the response keeps while it runs. ``C`` is its checkpoint: the conversation's state
    at a point, which :meth:`clear` and :meth:`roll_back` come back to (a position in
    its caches, not a copy of them). The abstract steps are the state machine's; the
    hooks with a body do nothing unless an engine needs them.

    Args:
        signal: the session's abort signal, set for this response.
        vocab_size: the engine's vocabulary (a ``reply`` mark's ids must be below it).
    """

    def __init__(self, signal: AbortSignal, vocab_size: int) -> None:
        self.signal = signal
        self.vocab_size = vocab_size
        self.last_input = False
        """Whether the input chunk :meth:`take` is given is the segment's last (the
        reply, or the segment's end, comes next): an engine may queue its prefill
        rather than wait for it, so that the reply's opening shares its forward."""

    # -- checkpoints ---------------------------------------------------------------------

    @abstractmethod
    def checkpoint(self) -> C:
        """The conversation as it stands.

        :func:`respond` keeps one only where the engine's state holds no open user turn:
        at the start, after a mark (a truncation cut what an open turn had prefilled;
        :meth:`after_input` may feed it again) and after instructions fed between turns.
        """

    @abstractmethod
    async def roll_back(self, start: C) -> None:
        """A failure: come back to ``start``, keeping what the caller set since
        (instructions) and leaving the engine in step with the conversation."""

    # -- input ---------------------------------------------------------------------------

    async def before_input(self, fields: Fields) -> None:
        """Hook, before each chunk is dispatched (a mark's or plain input's): where an
        engine that buffers input (a clip sent whole) ends or drops it."""

    @abstractmethod
    async def instruct(
        self, instructions: torch.Tensor | str | None, tools: torch.Tensor | str | None = None
    ) -> bool:
        """Set the conversation's instructions and tools (the ``instructions`` and
        ``tools`` fields' values; None: the one set before stays).

        Returns:
            Whether they were fed now, between user turns (``committed`` moves past
            them); else they wait behind the open turn.

        Raises:
            ValueError: they are not text, or the tools cannot be rendered (the engine's
                own input error).
        """

    def tool_calls_turn(self, message: torch.Tensor | str) -> tuple[int, ...]:
        """The tokens of an assistant turn that called tools (``TOOL_CALLS_FIELD``'s
        value), as the chat template writes its content.

        Raises:
            TurnMarkError: the engine takes no tool calls (an engine that declares the
                field overrides this).
        """
        raise TurnMarkError("this engine takes no assistant turns with tool calls")

    @abstractmethod
    async def take(self, fields: Fields) -> None:
        """Add a chunk's text and audio to the user turn, opening one if none is open."""

    async def after_input(self, fields: Fields) -> None:
        """Hook, after each chunk was taken, unless the session was aborted meanwhile:
        where an engine brings its model up to the conversation (a prefill)."""

    def ahead(self) -> Fields | None:
        """Hook, after each chunk (:meth:`after_input` included): what to yield now of
        the open user turn, before its commit: its rows as they became final, and the
        taking back of rows sent ahead that a ``clear`` dropped or a truncation made
        stale (:data:`~.thinker_ports.USER_EDITS_FIELD`). None (the default): the turn's
        rows go when it is committed."""
        return None

    # -- marks ---------------------------------------------------------------------------

    @abstractmethod
    async def commit(self) -> Fields | None:
        """Close the open user turn; its rows to yield (None when no turn is open)."""

    @abstractmethod
    async def clear(self, committed: C) -> None:
        """Drop the open user turn: come back to ``committed``. Instructions that were
        waiting behind the turn are fed then."""

    @abstractmethod
    async def truncate(self, kept: int) -> None:
        """Cut the last reply to its first ``kept`` outputs.

        Raises:
            TurnMarkError: it cannot be cut now (:func:`~.turn_marks.check_truncatable`).
        """

    def moved_start(self) -> None:
        """Hook: a truncation moved ``start`` to the conversation as it left it."""

    @abstractmethod
    async def take_reply(self, tokens: tuple[int, ...]) -> None:
        """Take ``tokens`` into the conversation as the assistant's turn, as if decoded
        (the user turn was committed first): it is then the last reply."""

    def encode(self, text: str) -> Sequence[int]:
        """The ids of ``text`` as the chat template renders it inside an assistant turn
        (a ``reply`` mark given as text).

        Raises:
            TurnMarkError: the engine takes a reply's token ids only (the default).
        """
        raise TurnMarkError(
            "this engine takes a reply mark's token ids only, not an assistant turn's text"
        )

    async def instruct_reply(self, instructions: str, tools: str | None = None) -> None:
        """Feed ``instructions`` (and ``tools``, a JSON array, when given) as a system
        turn for this reply alone (no user turn is open; the conversation's own
        instructions and tools stay as they are).

        Raises:
            ValueError: the engine follows no instructions of a response's own (the
                default).
        """
        raise ValueError("this engine follows no instructions of a response's own")

    async def drop_instructions(self, before: C) -> None:
        """The reply given under a response's own instructions was kept: come back to
        ``before`` (where they were fed), then take the reply, as far as it was kept,
        back into the conversation as :meth:`take_reply` does (none, if it has no
        token yet: the user turn stays without one). The session's sampling state is
        not rolled back, and the reply still counts as the one the response decoded."""
        raise ValueError("this engine follows no instructions of a response's own")

    def refused(self, error: TurnMarkError) -> Exception:
        """The error to raise for a mark the session cannot take (an engine with an
        input error of its own raises it, with the same message)."""
        return error

    # -- the reply -----------------------------------------------------------------------

    @abstractmethod
    def reply(self, options: ResponseOptions) -> AsyncGenerator[Fields, None]:
        """Open the reply (committing the open user turn, its rows yielded first) and
        stream it, under the response's ``options``. It returns early, and the
        response is dropped, once the session is aborted."""

    # -- settling ------------------------------------------------------------------------

    @abstractmethod
    def end(self) -> None:
        """The response is over: the session may take another."""

    @abstractmethod
    def held(self) -> bool:
        """Whether the engine still holds this response's session state (not aborted)."""

    @abstractmethod
    def forget(self) -> None:
        """The response was dropped: let go of what it holds (the session's state too,
        if the engine still holds it and its ``abort`` will not free it)."""

    async def finish(self, outcome: Outcome) -> Outcome:
        """Finish the work still in flight before the conversation is settled.

        Returns:
            The outcome, ``failed`` if that work failed.
        """
        return outcome

    @abstractmethod
    def keep_reply(self) -> None:
        """A reply that ended or was cancelled stays, as far as it was yielded."""


async def respond(
    begin: Callable[[], Response[C]], inputs: AsyncIterator[Fields]
) -> AsyncGenerator[Fields, None]:
    """One response of a conversation: its input, then its reply (module docstring).

    An engine's ``generate`` returns this generator rather than iterating it in one of
    its own, so that the caller's ``aclose`` or ``athrow`` at a ``yield`` reaches it
    there: one around it would close it where the caller raised, cancelling a response
    the caller failed.

    Args:
        begin: starts the response (run when its first output is asked for): the
            session's state, its signal set. It raises if the session cannot respond.
        inputs: the response's input.

    Raises:
        TurnMarkError: a mark the session cannot take (or the engine's own error:
            :meth:`Response.refused`).
    """
    response = begin()
    signal = response.signal
    start = committed = response.checkpoint()
    before: C | None = None  # where the response's own instructions were fed
    outcome: Outcome = "dropped"
    try:
        while (fields := await signal.next_input(inputs)) is not None:
            await response.before_input(fields)
            mark = fields.get(TURN_FIELD)
            if mark is None:
                if (
                    INSTRUCTIONS_FIELD in fields or TOOLS_FIELD in fields
                ) and await response.instruct(
                    fields.get(INSTRUCTIONS_FIELD), fields.get(TOOLS_FIELD)
                ):
                    committed = response.checkpoint()  # a clear keeps them
                # A stage's inputs know when every source has ended the segment.
                response.last_input = bool(getattr(inputs, "all_read", False))
                await response.take(fields)
            elif mark == "commit":
                rows = await response.commit()
                committed = response.checkpoint()
                if rows is not None:
                    yield rows
            elif mark == "clear":
                await response.clear(committed)
                committed = response.checkpoint()
            elif mark == "truncate":
                earlier = response.checkpoint().reply is start.reply  # not taken back since
                await response.truncate(kept_of(fields))
                committed = response.checkpoint()
                if earlier:
                    start = committed
                    response.moved_start()
            elif mark == "reply":
                called = fields.get(TOOL_CALLS_FIELD)
                tokens = (
                    reply_of(fields, response.vocab_size, response.encode)
                    if called is None
                    else response.tool_calls_turn(called)
                )
                rows = await response.commit()
                if rows is not None:
                    yield rows
                    if signal.aborted:
                        return
                await response.take_reply(tokens)
                committed = response.checkpoint()
            else:
                raise TurnMarkError(f"unknown turn mark {mark!r}: commit, clear, truncate or reply")
            if signal.aborted:
                return
            await response.after_input(fields)
            if (sent := response.ahead()) is not None:
                yield sent
                if signal.aborted:
                    return
        if signal.aborted:
            return
        options = response_options(inputs)
        if options.instructions or options.tools:
            # They follow the user turn: it is committed first, as a commit mark is.
            commit: Fields = {TURN_FIELD: "commit"}
            await response.before_input(commit)
            rows = await response.commit()
            if rows is not None:
                yield rows
            if signal.aborted:
                return
            await response.after_input(commit)
            before = response.checkpoint()
            await response.instruct_reply(options.instructions or "", options.tools)
            if signal.aborted:
                return
        async with aclosing(response.reply(options)) as reply:
            async for output in reply:
                yield output
        if signal.aborted:
            return
        outcome = "done"
    except GeneratorExit:
        outcome = "cancelled"
        raise
    except asyncio.CancelledError:
        if output_overdue(inputs) and not signal.aborted:
            outcome = "failed"
        raise
    except Exception as exc:
        outcome = "failed"
        if isinstance(exc, TurnMarkError) and (refusal := response.refused(exc)) is not exc:
            raise refusal from None
        raise
    finally:
        await _settle(response, outcome, start, before)


async def _settle(response: Response[C], outcome: Outcome, start: C, before: C | None) -> None:
    """Leave the conversation as the response's outcome says (module docstring)."""
    response.end()
    if outcome == "dropped" or not response.held():
        response.forget()
        return
    outcome = await response.finish(outcome)
    if outcome == "failed":
        await response.roll_back(start)
        return
    response.keep_reply()
    if before is not None:
        try:
            await response.drop_instructions(before)
        except Exception:
            await response.roll_back(start)  # the response fails as a whole
            raise
