"""Two small engines that keep a conversation, for the conversation tests.

``TurnEcho`` (an entry stage) takes text and the caller's turn marks; it replies, one
character per output, with the user turns since its last reply, upper-cased and joined
by ``|``. Input ``?`` makes it reply with its whole history instead (user turns and its
replies as it keeps them, after cancels and truncates), so a test can read the state it
holds. Input ``FAIL`` makes the reply fail after two outputs. ``Speaker`` voices each
character as 100 samples and maps kept samples back to characters on truncate; given a
``hold`` path, it does not start while that file exists, so a test decides when a
restarted speaker comes back.
``AheadEcho`` is a ``TurnEcho`` that yields an output per text chunk while it reads
its input, as a thinker sends a user turn's rows ahead of its commit.
``ReplayEcho`` is a ``TurnEcho`` that takes its replies back (``REPLY_FIELD``; each
character is a token id, its code point), so a session can replay its conversation
onto it after a restart, and takes an assistant turn the caller gives by its text.
``Relay`` is an entry stage that keeps no conversation and writes no reply: it passes
the caller's text, turn marks and replies on in order, as a cascade's recognizer passes
them to its LLM, so the stage after it holds the conversation and writes the reply.
"""

from __future__ import annotations

import asyncio
import math
import pathlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from pydantic import BaseModel

from omni_actors.actors.engines.contract import (
    KEPT_FIELD,
    REPLY_FIELD,
    TURN_FIELD,
    Fields,
    ResponseOptions,
    response_options,
)
from omni_actors.errors import EngineError

SAMPLES_PER_CHAR = 100
STEP_S = 0.01  # between two outputs: a cancel can land mid-reply


@dataclass
class _Conversation:
    history: list[str] = field(default_factory=list)  # "u:..." and "a:..." entries
    unanswered: list[str] = field(default_factory=list)  # user turns since the last reply
    pending: str = ""


class TurnEcho:
    inputs: ClassVar[dict[str, str]] = {"text": "concat", "audio": "concat", TURN_FIELD: "concat"}
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None:
        self.sessions: dict[str, _Conversation] = {}
        self.audio: dict[str, list[torch.Tensor]] = {}  # every audio input, per session

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def abort(self, session: str) -> None:
        self.sessions.pop(session, None)

    async def release(self, session: str) -> None:
        self.sessions.pop(session, None)

    def _commit(self, c: _Conversation) -> None:
        if c.pending:
            c.unanswered.append(c.pending)
            c.history.append("u:" + c.pending)
            c.pending = ""

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        c = self.sessions.setdefault(session, _Conversation())
        start = (list(c.history), list(c.unanswered), c.pending)
        async for fields in inputs:
            mark = fields.get(TURN_FIELD)
            if mark == "commit":
                self._commit(c)
            elif mark == "clear":
                c.pending = ""
            elif mark == "truncate":
                kept = int(fields[KEPT_FIELD])  # type: ignore[arg-type]
                last = max(i for i, h in enumerate(c.history) if h.startswith("a:"))
                c.history[last] = c.history[last][: 2 + kept]
            text = fields.get("text")
            if isinstance(text, str):
                c.pending += text
            audio = fields.get("audio")
            if isinstance(audio, torch.Tensor):
                self.audio.setdefault(session, []).append(audio)
        self._commit(c)
        if c.unanswered == ["?"]:
            c.history.pop()  # the question is not part of the conversation
            reply = " ".join(c.history)
        else:
            reply = "|".join(c.unanswered).upper()
        c.unanswered = []
        limit = response_options(inputs).max_tokens
        if limit is not None:
            reply = reply[:limit]
        c.history.append("a:")
        last = len(c.history) - 1
        try:
            for k, char in enumerate(reply):
                if k == 2 and "FAIL" in reply:
                    raise EngineError("the reply failed on purpose")
                await asyncio.sleep(STEP_S)  # stands for a decode step
                c.history[last] += char
                yield {"text": char}
        except EngineError:
            c.history, c.unanswered, c.pending = start  # the response never happened
            raise


class AheadEcho(TurnEcho):
    outputs: ClassVar[dict[str, str]] = {"text": "concat", "rows": "concat"}

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        taken: list[Fields] = []
        async for fields in inputs:
            taken.append(fields)
            if isinstance(fields.get("text"), str):
                await asyncio.sleep(STEP_S)  # stands for a prefill
                yield {"rows": torch.zeros(1)}  # for a stage after it (none here takes it)
        async for out in super().generate(session, _Taken(taken, inputs)):
            yield out


class _Taken:
    """Input already read, with the response's options."""

    def __init__(self, taken: list[Fields], inputs: AsyncIterator[Fields]) -> None:
        self.taken, self.inputs = iter(taken), inputs

    @property
    def options(self) -> ResponseOptions:
        return response_options(self.inputs)

    def __aiter__(self) -> _Taken:
        return self

    async def __anext__(self) -> Fields:
        try:
            return next(self.taken)
        except StopIteration:
            raise StopAsyncIteration from None


class ReplayEcho(TurnEcho):
    inputs: ClassVar[dict[str, str]] = {**TurnEcho.inputs, REPLY_FIELD: "concat"}

    def __init__(self, args: object) -> None:
        super().__init__(args)
        self.replies: dict[str, tuple[int, ...] | None] = {}  # by the last generate
        self.replayed: dict[str, int] = {}  # reply marks taken, per session

    def last_reply(self, session: str) -> tuple[int, ...] | None:
        return self.replies.get(session)

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        self.replies[session] = None
        c = self.sessions.setdefault(session, _Conversation())
        said: list[int] = []
        try:
            async for out in super().generate(session, _Replies(self, session, c, inputs)):
                said.append(ord(str(out["text"])))
                self.replies[session] = tuple(said)  # a cancelled reply: as far as it went
                yield out
        except Exception:
            self.replies[session] = None  # rolled back: no reply
            raise
        self.replies[session] = tuple(said)


class _Replies:
    """``inputs`` with the reply marks taken into the conversation on the way."""

    def __init__(
        self, engine: ReplayEcho, session: str, c: _Conversation, inputs: AsyncIterator[Fields]
    ) -> None:
        self.engine, self.session, self.c, self.inputs = engine, session, c, inputs

    @property
    def options(self) -> ResponseOptions:
        return response_options(self.inputs)

    def __aiter__(self) -> _Replies:
        return self

    async def __anext__(self) -> Fields:
        while True:
            fields = await self.inputs.__anext__()
            if fields.get(TURN_FIELD) != "reply":
                return fields
            ids = fields.get(REPLY_FIELD)
            if isinstance(ids, torch.Tensor):
                said = "".join(chr(int(i)) for i in ids)
            else:  # a turn the caller gave by its words
                said = str(fields["text"])
            self.engine._commit(self.c)
            self.c.history.append("a:" + said)
            self.c.unanswered = []
            self.engine.replayed[self.session] = self.engine.replayed.get(self.session, 0) + 1


class Relay:
    inputs: ClassVar[dict[str, str]] = {
        "text": "concat",
        TURN_FIELD: "concat",
        KEPT_FIELD: "concat",
        REPLY_FIELD: "concat",
    }
    outputs: ClassVar[dict[str, str]] = inputs

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        async for fields in inputs:
            passed = {name: value for name, value in fields.items() if name in self.inputs}
            if passed:
                yield passed


class SpeakerArgs(BaseModel):
    hold: str | None = None  # a file: while it exists, the speaker does not start
    hold_s: float = 120.0  # how long it waits for the file to go before it fails


class Speaker:
    Args = SpeakerArgs
    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"audio": "concat"}

    def __init__(self, args: SpeakerArgs) -> None:
        self.said: dict[str, int] = {}  # characters voiced in the last reply
        self.args = args

    async def start(self) -> None:
        if self.args.hold is None:
            return
        hold = pathlib.Path(self.args.hold)
        async with asyncio.timeout(self.args.hold_s):
            # A file in another process has no waiter to await: look again and again.
            while hold.exists():  # noqa: ASYNC110
                await asyncio.sleep(0.02)

    async def stop(self) -> None: ...

    async def abort(self, session: str) -> None:
        self.said.pop(session, None)

    async def release(self, session: str) -> None:
        self.said.pop(session, None)

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        self.said[session] = 0
        async for fields in inputs:
            for _ in str(fields.get("text", "")):
                self.said[session] += 1
                yield {"audio": torch.full((SAMPLES_PER_CHAR,), 0.5)}

    async def truncate(self, session: str, kept: int) -> int:
        if session not in self.said:
            raise ValueError("no reply to truncate")
        return min(self.said[session], math.ceil(kept / SAMPLES_PER_CHAR))
