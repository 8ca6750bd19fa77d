"""An entry engine that keeps a conversation and can show it, for the item tests.

``Recall`` takes text, audio and the caller's turn marks, and its replies back
(``REPLY_FIELD``: each character is a token id, its code point; or an assistant turn's
``text``), so a session can replay its conversation onto it. It replies, one character
per output, with the user turns since its last reply, upper-cased and joined by ``|``
(a turn's audio shows as ``<audio>``), or ``-`` when there is none. A last user turn
``?`` makes it reply with the conversation it holds instead: its turns as ``u:…`` and
``a:…``, joined by spaces (the question is not kept).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from omni_actors.actors.engines.contract import (
    KEPT_FIELD,
    REPLY_FIELD,
    TURN_FIELD,
    Fields,
    response_options,
)

STEP_S = 0.002  # between two outputs: stands for a decode step


@dataclass
class _Conversation:
    turns: list[str] = field(default_factory=list)  # "u:..." and "a:..."
    unanswered: list[str] = field(default_factory=list)
    pending: str = ""


class Recall:
    inputs: ClassVar[dict[str, str]] = {
        "text": "concat",
        "audio": "concat",
        TURN_FIELD: "concat",
        REPLY_FIELD: "concat",
    }
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None:
        self.sessions: dict[str, _Conversation] = {}
        self.replies: dict[str, tuple[int, ...] | None] = {}
        self.prompts: dict[str, int] = {}

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def abort(self, session: str) -> None:
        self.sessions.pop(session, None)

    async def release(self, session: str) -> None:
        self.sessions.pop(session, None)

    def last_reply(self, session: str) -> tuple[int, ...] | None:
        return self.replies.get(session)

    def prompt_tokens(self, session: str) -> int | None:
        """A token per character of the conversation the last reply came from."""
        return self.prompts.get(session)

    @staticmethod
    def _commit(c: _Conversation) -> None:
        if c.pending:
            c.unanswered.append(c.pending)
            c.turns.append("u:" + c.pending)
            c.pending = ""

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        c = self.sessions.setdefault(session, _Conversation())
        self.replies[session] = None
        async for fields in inputs:
            mark = fields.get(TURN_FIELD)
            if mark == "commit":
                self._commit(c)
            elif mark == "clear":
                c.pending = ""
            elif mark == "truncate":
                kept = int(fields[KEPT_FIELD])  # type: ignore[arg-type]
                last = max(i for i, t in enumerate(c.turns) if t.startswith("a:"))
                c.turns[last] = c.turns[last][: 2 + kept]
            elif mark == "reply":
                ids = fields.get(REPLY_FIELD)
                given = fields.get("text")  # an assistant turn the caller gave by its words
                said = given if isinstance(given, str) else ""
                if isinstance(ids, torch.Tensor):
                    said = "".join(chr(int(i)) for i in ids)
                self._commit(c)
                c.turns.append("a:" + said)
                c.unanswered = []
                continue
            text = fields.get("text")
            if isinstance(text, str):
                c.pending += text
            if isinstance(fields.get("audio"), torch.Tensor):
                c.pending += "<audio>"
        self._commit(c)
        if c.unanswered[-1:] == ["?"]:
            c.turns.pop()  # the question is not part of the conversation
            reply = " ".join(c.turns)
        else:
            reply = "|".join(c.unanswered).upper() or "-"
        c.unanswered = []
        self.prompts[session] = len(" ".join(c.turns))
        reply = reply[: response_options(inputs).max_tokens]
        c.turns.append("a:")
        said: list[int] = []
        for char in reply:
            await asyncio.sleep(STEP_S)
            c.turns[-1] += char
            said.append(ord(char))
            self.replies[session] = tuple(said)  # a cancelled reply: as far as it went
            yield {"text": char}
