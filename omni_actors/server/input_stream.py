"""``InputStream``: a connection's input to its session, in order, never blocking reads.

Client events arrive faster than a busy pipeline takes input: while the thinker
replies, the entry stage takes no new input, and a client streaming 20 ms frames would
fill the session's credit window in about a second. The connection therefore never
waits on the pipeline while it reads: each operation (audio, text, an assistant turn,
commit, clear, respond, truncate, instructions, tools, a tool's result, delete,
transcription on or off) is queued here, and one task hands them to the session in
order. Audio queued back to back goes as one ``send``, so a backlog costs one chunk, not
one per frame; the backlog is bounded by the connection (its ``max_input_buffer_s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    TOOL_RESULT_FIELD,
    TOOLS_FIELD,
)
from omni_actors.errors import OmniError
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.session_input import SessionClosedError
from omni_actors.server.response_stream import ResponseStream
from omni_actors.server.session_config import TranscriptionSettings
from omni_actors.server.tools import OfferedTool, template_tools

__all__ = ["InputStream", "Op"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Op:
    """One queued operation; ``event_id`` is the client event it came from; ``turn``: the
    item a ``commit`` makes a user turn (its transcript names it too) or a ``reply`` an
    assistant turn, or the turn (an item, or a response's id) a ``delete`` takes out;
    ``calls``: the tools a ``reply`` called (a JSON array)."""

    # audio | text | reply | commit | clear | respond | truncate | instructions | tools
    # | tool_result | delete | transcribe
    kind: str
    event_id: str | None = None
    samples: torch.Tensor | None = None
    text: str = ""
    audio_ms: int = 0
    stream: ResponseStream | None = None
    turn: str = ""
    calls: str | None = None
    transcription: TranscriptionSettings | None = None  # transcribe: None turns it off
    content_index: int = 0  # truncate: the content part the client named


class InputStream:
    """Queued input of one session (see the module docstring).

    Args:
        session: the connection's session.
        sample_rate: the rate of the queued audio.
        on_error: told of an operation the session refused (with its client
            ``event_id``), and of a response it could not start.
        on_truncated: told, once a truncate is taken, of it and the text the user heard
            of the reply it cut (None: not known).
    """

    def __init__(
        self,
        session: Session,
        sample_rate: int,
        on_error: Callable[[OmniError, Op], Awaitable[None]],
        on_truncated: Callable[[Op, str | None], Awaitable[None]] | None = None,
    ) -> None:
        self.session = session
        self._on_truncated = on_truncated
        self.rate = sample_rate
        self._on_error = on_error
        self._ops: deque[Op] = deque()
        self._ready = asyncio.Event()
        self.queued_samples = 0  # audio queued, not yet sent

    def put(self, op: Op) -> None:
        """Queue ``op``; a ``clear`` drops the audio queued since the last boundary."""
        if op.kind == "clear":
            while self._ops and self._ops[-1].kind == "audio":
                dropped = self._ops.pop()
                assert dropped.samples is not None
                self.queued_samples -= dropped.samples.numel()
        elif op.kind == "audio":
            assert op.samples is not None
            self.queued_samples += op.samples.numel()
        self._ops.append(op)
        self._ready.set()

    async def run(self) -> None:
        """Hand the queued operations to the session until it ends (the owner cancels)."""
        while True:
            if not self._ops:
                self._ready.clear()
                await self._ready.wait()
                continue
            op = self._ops.popleft()
            try:
                await self._apply(op)
            except SessionClosedError:
                return  # the session's terminal event tells the connection why
            except OmniError as exc:
                await self._on_error(exc, op)

    async def _apply(self, op: Op) -> None:
        session = self.session
        if op.kind == "audio":
            pieces = [op.samples]
            while self._ops and self._ops[0].kind == "audio":
                pieces.append(self._ops.popleft().samples)
            frames = [p for p in pieces if p is not None]
            # The common case is one frame: send it as it is, without a copy.
            audio = frames[0] if len(frames) == 1 else torch.cat(frames)
            self.queued_samples -= audio.numel()
            await session.send(audio=audio, sample_rate=self.rate)
        elif op.kind == "text":
            await session.send(text=op.text)
        elif op.kind == "reply":
            await session.add_reply(op.text, tool_calls=op.calls, turn=op.turn)
        elif op.kind == "instructions":
            fields = {INSTRUCTIONS_FIELD: op.text}
            if self._ops and self._ops[0].kind == "tools":
                # Set together (one session.update): one system turn holds both.
                fields[TOOLS_FIELD] = self._ops.popleft().text
            await session.send(fields=fields)
        elif op.kind == "tools":
            await session.send(fields={TOOLS_FIELD: op.text})
        elif op.kind == "tool_result":
            await session.send(fields={TOOL_RESULT_FIELD: op.text})
        elif op.kind == "commit":
            await session.commit(turn=op.turn)
        elif op.kind == "transcribe":
            wanted = op.transcription
            await session.transcribe(
                wanted is not None,
                language=wanted.language if wanted is not None else None,
                prompt=wanted.prompt if wanted is not None else None,
            )
        elif op.kind == "clear":
            await session.clear()
        elif op.kind == "truncate":
            # A response cut while in flight was cancelled first: once ``cancel``
            # returned, the session takes the truncate.
            heard = await session.truncate(op.audio_ms)
            if self._on_truncated is not None:
                await self._on_truncated(op, heard)
        elif op.kind == "delete":
            await session.delete(op.turn)
        elif op.kind == "respond":
            stream = op.stream
            assert stream is not None
            if stream.cancel_reason is not None:
                # Cancelled before it started: the pipeline never hears of it.
                await self._on_error(OmniError("cancelled before it started"), op)
                return
            settings = stream.settings
            stream.response = await session.respond(
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                voice=settings.speaker,
                response_id=stream.id,
                instructions=settings.instructions,
                tools=None
                if settings.tools is None
                else template_tools(
                    OfferedTool(t.name, t.description, t.parameters) for t in settings.tools
                ),
            )
            log.debug("session %s response %s started", session.id, stream.id)
            if stream.cancel_reason is not None:
                # Cancelled while ``respond`` waited (for the entry stage's credit): there
                # was nothing to stop then, so it is stopped now (no delta of it follows).
                await stream.response.cancel()
        else:  # pragma: no cover - the connection builds the ops
            raise AssertionError(op.kind)
