"""A small entry engine that shows what a chat completion gave it, for the chat tests.

``Echo`` replies, one character per output, with its instructions in brackets (if any)
and the user turns since its last reply joined by ``|``, then the voice asked for in
parentheses (if any); a turn's audio shows as ``<audio:N>`` (N samples, at the
pipeline's input rate). It honours ``max_tokens`` by cutting the reply. ``Voice``
speaks each character as ``SAMPLES_PER_CHAR`` samples.

``Transcript`` keeps a conversation and replies with all of it as it holds it: ``s:``
for instructions, ``u:`` for a user turn, ``a:`` for a reply (one given by the caller
with its words, one it generated as ``#n``, its n-th), then ``r:`` and the response's own
instructions, which it follows for that reply alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import ClassVar

import torch

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    REPLY_FIELD,
    TURN_FIELD,
    Fields,
    response_options,
)

SAMPLES_PER_CHAR = 240  # 10 ms at 24 kHz
STEP_S = 0.002


class Echo:
    inputs: ClassVar[dict[str, str]] = {
        "text": "concat",
        "audio": "concat",
        "instructions": "replace",
        TURN_FIELD: "concat",
    }
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None:
        self.instructions: dict[str, str] = {}
        self.turns: dict[str, list[str]] = {}
        self.pending: dict[str, str] = {}

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def abort(self, session: str) -> None:
        await self.release(session)

    async def release(self, session: str) -> None:
        for held in (self.instructions, self.turns, self.pending):
            held.pop(session, None)

    def _commit(self, session: str) -> None:
        pending = self.pending.pop(session, "")
        if pending:
            self.turns.setdefault(session, []).append(pending)

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        async for fields in inputs:
            if fields.get(TURN_FIELD) == "commit":
                self._commit(session)
            instructions = fields.get("instructions")
            if isinstance(instructions, str):
                self.instructions[session] = instructions
            text = fields.get("text")
            if isinstance(text, str):
                self.pending[session] = self.pending.get(session, "") + text
            audio = fields.get("audio")
            if isinstance(audio, torch.Tensor):
                heard = f"<audio:{audio.numel()}>"
                self.pending[session] = self.pending.get(session, "") + heard
        self._commit(session)
        said = self.instructions.get(session)
        reply = (f"[{said}]" if said else "") + "|".join(self.turns.pop(session, []))
        options = response_options(inputs)
        if options.voice is not None:
            reply += f"({options.voice})"
        for char in reply[: options.max_tokens]:
            await asyncio.sleep(STEP_S)  # stands for a decode step
            yield {"text": char}


class Voice:
    inputs: ClassVar[dict[str, str]] = {"text": "concat"}
    outputs: ClassVar[dict[str, str]] = {"audio": "concat"}

    def __init__(self, args: object) -> None: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def abort(self, session: str) -> None: ...
    async def release(self, session: str) -> None: ...

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        async for fields in inputs:
            for _ in str(fields.get("text", "")):
                yield {"audio": torch.full((SAMPLES_PER_CHAR,), 0.25)}


class Transcript:
    inputs: ClassVar[dict[str, str]] = {
        "text": "concat",
        INSTRUCTIONS_FIELD: "concat",
        TURN_FIELD: "concat",
        REPLY_FIELD: "concat",
    }
    outputs: ClassVar[dict[str, str]] = {"text": "concat"}

    def __init__(self, args: object) -> None:
        self.held: dict[str, list[str]] = {}
        self.pending: dict[str, str] = {}
        self.replies: dict[str, int] = {}

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def abort(self, session: str) -> None:
        await self.release(session)

    async def release(self, session: str) -> None:
        for held in (self.held, self.pending, self.replies):
            held.pop(session, None)

    def _commit(self, session: str) -> None:
        pending = self.pending.pop(session, "")
        if pending:
            self.held.setdefault(session, []).append("u:" + pending)

    async def generate(self, session: str, inputs: AsyncIterator[Fields]) -> AsyncIterator[Fields]:
        held = self.held.setdefault(session, [])
        async for fields in inputs:
            mark = fields.get(TURN_FIELD)
            if mark == "commit":
                self._commit(session)
            elif mark == "reply":
                self._commit(session)
                held.append(f"a:{fields['text']}")
            elif mark is None:
                instructions = fields.get(INSTRUCTIONS_FIELD)
                if isinstance(instructions, str):
                    held.append("s:" + instructions)
                text = fields.get("text")
                if isinstance(text, str):
                    self.pending[session] = self.pending.get(session, "") + text
        self._commit(session)
        reply = " ".join(held)
        own = response_options(inputs).instructions
        if own:
            reply += " r:" + own
        self.replies[session] = self.replies.get(session, 0) + 1
        held.append(f"a:#{self.replies[session]}")
        for char in reply:
            await asyncio.sleep(STEP_S)  # stands for a decode step
            yield {"text": char}
