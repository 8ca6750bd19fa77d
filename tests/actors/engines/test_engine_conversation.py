"""The conversation engines' state machine (``respond``) on a conversation of words.

``Chat`` is an engine's session state at its simplest: the conversation as a list of
tokens, its last reply and the user turn open in it. Each test drives one response
through ``respond`` and reads the list it leaves: each mark, each checkpoint and how
each outcome settles the conversation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass, field

import pytest
import torch

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    KEPT_FIELD,
    REPLY_FIELD,
    TOOL_CALLS_FIELD,
    TOOLS_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
)
from omni_actors.actors.engines.conversation import Response, respond, settings
from omni_actors.actors.engines.torch_engine import AbortSignal
from omni_actors.actors.engines.turn_marks import TurnMarkError, check_truncatable
from omni_actors.errors import EngineError
from omni_actors.testing import eventually

COMMIT: Fields = {TURN_FIELD: "commit"}
CLEAR: Fields = {TURN_FIELD: "clear"}
SESSION = "s"


def say(text: str) -> Fields:
    return {"text": text}


def truncate(kept: int) -> Fields:
    return {TURN_FIELD: "truncate", KEPT_FIELD: torch.tensor(kept)}


def reply(*ids: int) -> Fields:
    return {TURN_FIELD: "reply", REPLY_FIELD: torch.tensor(ids, dtype=torch.long)}


@dataclass(frozen=True)
class Said:
    """The last reply: where its words start in the list, and its words."""

    start: int
    words: tuple[str, ...]


@dataclass(frozen=True)
class Mark:
    length: int
    reply: Said | None
    turns_since_reply: int


@dataclass
class Chat:
    """A session's conversation: a list of tokens and the bookkeeping around it."""

    tokens: list[str] = field(default_factory=list)
    reply: Said | None = None
    turn_start: int | None = None
    turns_since_reply: int = 0
    signal: AbortSignal | None = None
    decoded: tuple[str, ...] | None = None

    def restore(self, mark: Mark) -> None:
        del self.tokens[mark.length :]
        self.reply, self.turns_since_reply, self.turn_start = (
            mark.reply,
            mark.turns_since_reply,
            None,
        )


class WordError(EngineError, ValueError):
    """The fake engine's own input error (``refused`` retypes a mark's as one)."""


class Talk(Response[Mark]):
    """A response on a ``Chat``: it answers with ``answer``'s words, failing at word
    ``fail_at`` if set."""

    def __init__(self, engine: Words, chat: Chat, signal: AbortSignal) -> None:
        super().__init__(signal, vocab_size=100)
        self.engine, self.chat = engine, chat
        self.decoding = False

    def checkpoint(self) -> Mark:
        chat = self.chat
        length = len(chat.tokens) if chat.turn_start is None else chat.turn_start
        return Mark(length, chat.reply, chat.turns_since_reply)

    async def roll_back(self, start: Mark) -> None:
        self.chat.restore(start)

    async def instruct(
        self, instructions: torch.Tensor | str | None, tools: torch.Tensor | str | None = None
    ) -> bool:
        if self.chat.turn_start is not None:
            return False  # the fake drops instructions said inside a turn
        if instructions is not None:
            assert isinstance(instructions, str)
            self.chat.tokens += ["<sys>", instructions, "</sys>"]
        if tools is not None:
            assert isinstance(tools, str)
            self.chat.tokens += ["<tools>", tools, "</tools>"]
        return True

    async def take(self, fields: Fields) -> None:
        text = fields.get("text")
        if isinstance(text, str):
            if self.chat.turn_start is None:
                self.chat.turn_start = len(self.chat.tokens)
                self.chat.tokens.append("<user>")
            self.chat.tokens.append(text)

    async def commit(self) -> Fields | None:
        chat = self.chat
        if chat.turn_start is None:
            return None
        chat.tokens.append("</user>")
        rows = " ".join(chat.tokens[chat.turn_start :])
        chat.turn_start = None
        chat.turns_since_reply += 1
        return {"user": rows}

    async def clear(self, committed: Mark) -> None:
        self.chat.restore(committed)

    async def truncate(self, kept: int) -> None:
        chat = self.chat
        said = check_truncatable(
            chat.reply,
            committed_after=chat.turns_since_reply > 0 or chat.turn_start is not None,
            kept=kept,
        )
        del chat.tokens[said.start + kept :]
        chat.tokens.append("</a>")
        chat.reply = Said(said.start, said.words[:kept])

    async def take_reply(self, tokens: tuple[int, ...]) -> None:
        words = tuple(str(t) for t in tokens)
        self._open()
        self.chat.tokens += [*words, "</a>"]
        self.chat.reply = Said(len(self.chat.tokens) - len(words) - 1, words)

    def tool_calls_turn(self, message: torch.Tensor | str) -> tuple[int, ...]:
        assert isinstance(message, str)
        return (len(message),)  # the fake's "rendering": one token, the text's length

    def encode(self, text: str) -> list[int]:
        return [int(word) for word in text.split()]  # this engine's words are numbers

    async def instruct_reply(self, instructions: str, tools: str | None = None) -> None:
        offered = ["<tools>", tools, "</tools>"] if tools is not None else []
        self.chat.tokens += ["<sys>", instructions, *offered, "</sys>"]

    async def drop_instructions(self, before: Mark) -> None:
        said = self.chat.reply if self.decoding else None
        self.chat.restore(before)
        if said is not None:
            self._open()
            self.chat.tokens += [*said.words, "</a>"]
            self.chat.reply = Said(len(self.chat.tokens) - len(said.words) - 1, said.words)

    def refused(self, error: TurnMarkError) -> Exception:
        return WordError(str(error)) if self.engine.retype else error

    async def reply(self, options: ResponseOptions) -> AsyncGenerator[Fields, None]:
        rows = await self.commit()
        if rows is not None:
            yield rows
        self._open()
        self.decoding = True
        for i, word in enumerate(self.engine.answer):
            if i == self.engine.fail_at:
                raise RuntimeError("the model failed")
            said = self.chat.reply
            assert said is not None
            self.chat.tokens.append(word)
            self.chat.reply = Said(said.start, (*said.words, word))
            yield {"text": word}

    def _open(self) -> None:
        self.chat.tokens.append("<a>")
        self.chat.reply = Said(len(self.chat.tokens), ())
        self.chat.turns_since_reply = 0

    def end(self) -> None:
        self.chat.signal = None

    def held(self) -> bool:
        return self.engine.sessions.get(SESSION) is self.chat

    def forget(self) -> None:
        if self.held():
            del self.engine.sessions[SESSION]

    def keep_reply(self) -> None:
        if self.decoding and self.chat.reply is not None:
            self.chat.tokens.append("</a>")
            self.chat.decoded = self.chat.reply.words


class Words:
    """An engine of one session whose replies are ``answer``."""

    def __init__(self, answer: Iterable[str] = ("fine", "thanks")) -> None:
        self.answer = tuple(answer)
        self.fail_at: int | None = None
        self.retype = False
        self.sessions: dict[str, Chat] = {SESSION: Chat()}

    @property
    def chat(self) -> Chat:
        return self.sessions[SESSION]

    def generate(self, inputs: AsyncIterator[Fields]) -> AsyncGenerator[Fields, None]:
        return respond(self._begin, inputs)

    def _begin(self) -> Talk:
        chat = self.sessions.setdefault(SESSION, Chat())
        chat.signal = AbortSignal()
        chat.decoded = None
        return Talk(self, chat, chat.signal)

    def abort(self) -> None:
        chat = self.sessions.pop(SESSION)
        assert chat.signal is not None
        chat.signal.abort()

    async def respond(self, *items: Fields, options: ResponseOptions | None = None) -> list[Fields]:
        return [out async for out in self.generate(Inputs(items, options=options))]


class Inputs:
    """A response's input: ``items``, then (if ``hold``) nothing until it is ended."""

    def __init__(
        self,
        items: Iterable[Fields] = (),
        *,
        hold: bool = False,
        options: ResponseOptions | None = None,
    ) -> None:
        self.queue: asyncio.Queue[Fields | None] = asyncio.Queue()
        self.output_overdue = False  # as a stage's input says when it cancels a reply
        if options is not None:
            self.options = options  # as a stage's input carries them
        for item in items:
            self.queue.put_nowait(item)
        if not hold:
            self.queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[Fields]:
        return self

    async def __anext__(self) -> Fields:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item


def words(outputs: list[Fields]) -> list[str]:
    return [str(o["text"]) for o in outputs if "text" in o]


TURN = ["<user>", "hi", "</user>"]
ANSWER = ["<a>", "fine", "thanks", "</a>"]


async def test_commit_yields_the_turn_and_a_clear_comes_back_to_it() -> None:
    engine = Words()
    outputs = await engine.respond(say("hi"), COMMIT, say("no"), say("wait"), CLEAR)
    assert outputs[0] == {"user": "<user> hi </user>"}
    assert words(outputs) == ["fine", "thanks"]
    assert engine.chat.tokens == [*TURN, *ANSWER]


async def test_a_clear_keeps_instructions_fed_between_turns() -> None:
    engine = Words()
    await engine.respond({INSTRUCTIONS_FIELD: "be brief"}, say("no"), CLEAR, say("hi"))
    assert engine.chat.tokens == ["<sys>", "be brief", "</sys>", *TURN, *ANSWER]


async def test_a_reply_mark_commits_the_open_turn_and_takes_the_reply_back() -> None:
    engine = Words()
    outputs = await engine.respond(say("hi"), reply(5, 6), say("no"), CLEAR)
    assert outputs[0] == {"user": "<user> hi </user>"}
    # A clear after the mark keeps the reply: it moved ``committed``.
    assert engine.chat.tokens == [*TURN, "<a>", "5", "6", "</a>", *ANSWER]
    assert engine.chat.decoded == ("fine", "thanks")  # the decoded reply, not the mark's


async def test_tools_are_set_as_instructions_are() -> None:
    engine = Words()
    await engine.respond({TOOLS_FIELD: "[t]"}, say("no"), CLEAR, say("hi"))
    assert engine.chat.tokens == ["<tools>", "[t]", "</tools>", *TURN, *ANSWER]


async def test_a_reply_mark_may_give_a_turn_that_called_tools() -> None:
    engine = Words()
    called: Fields = {TURN_FIELD: "reply", TOOL_CALLS_FIELD: "call"}
    outputs = await engine.respond(say("hi"), called, say("no"), CLEAR)
    assert outputs[0] == {"user": "<user> hi </user>"}
    assert engine.chat.tokens == [*TURN, "<a>", "4", "</a>", *ANSWER]
    # Without the mark, the field is plain input: no assistant turn is taken.
    plain = Words()
    await plain.respond(say("hi"), {TOOL_CALLS_FIELD: "call"})
    assert plain.chat.tokens == [*TURN, *ANSWER]


async def test_a_reply_mark_may_give_the_turn_by_its_text() -> None:
    engine = Words()
    await engine.respond(say("hi"), {TURN_FIELD: "reply", "text": "5 6"})
    assert engine.chat.tokens == [*TURN, "<a>", "5", "6", "</a>", *ANSWER]
    with pytest.raises(TurnMarkError, match=r"^a reply mark's token ids must be in \[0, 100\)"):
        await engine.respond({TURN_FIELD: "reply", "text": "100"})


OWN = ResponseOptions(instructions="be brief")


async def test_a_responses_own_instructions_hold_for_its_reply_alone() -> None:
    engine = Words()
    seen: list[str] = []
    outputs = []
    async for out in engine.generate(Inputs([say("hi")], options=OWN)):
        outputs.append(out)
        if "text" in out and not seen:
            seen = list(engine.chat.tokens)  # what the reply follows
    assert outputs[0] == {"user": "<user> hi </user>"}
    assert words(outputs) == ["fine", "thanks"]
    assert seen == [*TURN, "<sys>", "be brief", "</sys>", "<a>", "fine"]
    # Kept without them: as a conversation that never had them holds it.
    assert engine.chat.tokens == [*TURN, *ANSWER]
    assert engine.chat.reply == Said(4, ("fine", "thanks"))
    assert engine.chat.decoded == ("fine", "thanks")  # the reply the session stores
    await engine.respond(truncate(1))  # the reply is the conversation's last
    assert engine.chat.tokens == [*TURN, "<a>", "fine", "</a>", *ANSWER]


async def test_a_responses_own_instructions_leave_the_conversations_own() -> None:
    engine = Words()
    await engine.respond({INSTRUCTIONS_FIELD: "always"}, say("hi"), options=OWN)
    assert engine.chat.tokens == ["<sys>", "always", "</sys>", *TURN, *ANSWER]


async def test_a_responses_own_tools_hold_for_its_reply_alone() -> None:
    engine = Words()
    seen: list[str] = []
    own = ResponseOptions(tools="[t]")
    async for out in engine.generate(Inputs([{TOOLS_FIELD: "[s]"}, say("hi")], options=own)):
        if "text" in out and not seen:
            seen = list(engine.chat.tokens)  # what the reply follows
    session_tools = ["<tools>", "[s]", "</tools>"]
    own_turn = ["<sys>", "", "<tools>", "[t]", "</tools>", "</sys>"]
    assert seen == [*session_tools, *TURN, *own_turn, "<a>", "fine"]
    # Kept without them; the conversation's own tools stay.
    assert engine.chat.tokens == [*session_tools, *TURN, *ANSWER]


async def test_a_cancelled_reply_under_its_own_instructions_keeps_what_was_said() -> None:
    engine = Words(["one", "two", "three"])
    outputs = engine.generate(Inputs([say("hi")], options=OWN))
    assert "user" in await anext(outputs)
    assert await anext(outputs) == {"text": "one"}
    await outputs.aclose()
    assert engine.chat.tokens == [*TURN, "<a>", "one", "</a>"]


async def test_a_failed_reply_under_its_own_instructions_rolls_them_back() -> None:
    engine = Words()
    engine.fail_at = 1
    with pytest.raises(RuntimeError):
        await engine.respond(say("hi"), options=OWN)
    assert engine.chat.tokens == []


async def test_truncating_a_reply_from_before_the_response_moves_its_start() -> None:
    engine = Words()
    await engine.respond(say("hi"))
    engine.fail_at = 1
    with pytest.raises(RuntimeError, match="the model failed"):
        await engine.respond(truncate(1), say("what"))
    # The failure comes back to the cut, not to the reply as it was before it.
    assert engine.chat.tokens == [*TURN, "<a>", "fine", "</a>"]
    assert engine.chat.reply == Said(4, ("fine",))


async def test_truncating_a_reply_taken_back_in_the_response_keeps_its_start() -> None:
    engine = Words()
    await engine.respond(say("hi"))
    before = list(engine.chat.tokens)
    engine.fail_at = 0
    with pytest.raises(RuntimeError):
        await engine.respond(say("and"), reply(7, 8), truncate(1), say("so"))
    assert engine.chat.tokens == before  # the reply taken back goes with the rollback
    assert engine.chat.reply == Said(4, ("fine", "thanks"))


async def test_the_end_of_input_commits_the_open_turn_before_the_reply() -> None:
    engine = Words()
    outputs = await engine.respond(say("hi"))
    assert outputs == [{"user": "<user> hi </user>"}, {"text": "fine"}, {"text": "thanks"}]
    assert engine.chat.tokens == [*TURN, *ANSWER]


async def test_a_mark_refused_fails_the_response_and_rolls_it_back() -> None:
    engine = Words()
    with pytest.raises(TurnMarkError, match=r"^unknown turn mark 'undo': commit, clear"):
        await engine.respond(say("hi"), COMMIT, {TURN_FIELD: "undo"})
    assert engine.chat.tokens == []
    with pytest.raises(TurnMarkError, match=r"^the session has no reply to truncate$"):
        await engine.respond(say("hi"), truncate(1))
    assert engine.chat.tokens == []
    with pytest.raises(TurnMarkError, match=r"^a reply mark's token ids must be in \[0, 100\)"):
        await engine.respond(reply(100))


async def test_an_engine_retypes_a_refused_mark_with_the_same_message() -> None:
    engine = Words()
    engine.retype = True
    with pytest.raises(WordError, match=r"^the session has no reply to truncate$") as caught:
        await engine.respond(truncate(1))
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


async def test_done_keeps_the_reply() -> None:
    engine = Words()
    await engine.respond(say("hi"))
    assert engine.chat.tokens == [*TURN, *ANSWER]
    assert engine.chat.decoded == ("fine", "thanks")
    assert engine.chat.signal is None


async def test_cancelled_keeps_the_reply_as_far_as_it_was_yielded() -> None:
    engine = Words(["one", "two", "three"])
    outputs = engine.generate(Inputs([say("hi")]))
    assert "user" in await anext(outputs)
    assert await anext(outputs) == {"text": "one"}
    await outputs.aclose()
    assert engine.chat.tokens == [*TURN, "<a>", "one", "</a>"]
    assert engine.chat.decoded == ("one",)
    assert engine.chat.signal is None


async def test_failed_comes_back_to_the_start_and_the_session_goes_on() -> None:
    engine = Words()
    await engine.respond(say("hi"))
    engine.fail_at = 1
    with pytest.raises(RuntimeError):
        await engine.respond(say("again"), COMMIT, say("more"))
    assert engine.chat.tokens == [*TURN, *ANSWER]
    assert engine.chat.reply == Said(4, ("fine", "thanks"))
    assert engine.chat.decoded is None
    engine.fail_at = None
    assert words(await engine.respond(say("hi"))) == ["fine", "thanks"]


async def test_an_error_thrown_in_at_a_yield_fails_the_response() -> None:
    engine = Words()
    outputs = engine.generate(Inputs([say("hi")]))
    await anext(outputs)
    assert await anext(outputs) == {"text": "fine"}
    with pytest.raises(EngineError, match="refused"):
        await outputs.athrow(EngineError("output refused"))
    assert engine.chat.tokens == []
    assert engine.chat.decoded is None


async def test_dropped_by_an_abort_ends_the_response_at_once() -> None:
    engine = Words()
    chat = engine.chat
    inputs = Inputs([say("hi")], hold=True)
    outputs: list[Fields] = []

    async def run() -> None:
        outputs.extend([out async for out in engine.generate(inputs)])

    task = asyncio.create_task(run())
    await eventually(lambda: inputs.queue.empty() and chat.signal is not None)
    engine.abort()
    await task  # no reply: the input never ended
    assert outputs == []
    assert chat.signal is None
    assert SESSION not in engine.sessions


async def test_dropped_by_a_cancelled_task_forgets_the_session() -> None:
    engine = Words()
    inputs = Inputs([say("hi")], hold=True)

    async def run() -> None:
        async for _ in engine.generate(inputs):
            pass

    task = asyncio.create_task(run())
    await eventually(lambda: inputs.queue.empty() and engine.chat.signal is not None)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert SESSION not in engine.sessions


async def test_a_cancel_for_an_overdue_first_output_fails_the_response_alone() -> None:
    engine = Words()
    await engine.respond(say("hi"))
    inputs = Inputs([say("again")], hold=True)

    async def run() -> None:
        async for _ in engine.generate(inputs):
            pass

    task = asyncio.create_task(run())
    await eventually(lambda: inputs.queue.empty() and engine.chat.signal is not None)
    inputs.output_overdue = True  # the stage's deadline passed: it cancels the reply
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # As a failure: back to where the response started, the conversation kept.
    assert engine.chat.tokens == [*TURN, *ANSWER]
    assert engine.chat.signal is None
    assert words(await engine.respond(say("hi"))) == ["fine", "thanks"]


async def test_dropped_by_an_abort_mid_reply_keeps_nothing_of_it() -> None:
    engine = Words()
    chat = engine.chat
    outputs = engine.generate(Inputs([say("hi")]))
    await anext(outputs)
    assert await anext(outputs) == {"text": "fine"}
    engine.abort()
    assert [out async for out in outputs] == [{"text": "thanks"}]  # the fake does not stop
    assert chat.decoded is None  # not a reply that ended: the session is gone
    assert chat.signal is None


def test_settings_keep_what_is_not_set_again_and_stand_for_the_same_tools() -> None:
    given = '[{"name": "f"}]'
    assert settings(("be brief", "[]"), None, given) == ("be brief", given)
    assert settings(("be brief", "[t]"), "be kind", None) == ("be kind", "[t]")
    assert settings(("be brief", "[t]"), None, "[t]") is None  # the system turn stands
    assert settings(("be brief", "[t]"), "be brief", "[t]") == ("be brief", "[t]")

    class Refused(ValueError):
        pass

    with pytest.raises(Refused, match="'tools' must be text"):
        settings(("", "[]"), None, torch.zeros(1), Refused)
