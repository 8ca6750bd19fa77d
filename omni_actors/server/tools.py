"""The server's side of tools: what the entry stage is given, and what a reply calls.

Both APIs offer function tools the same way to the pipeline: the entry stage gets them
as :data:`~omni_actors.actors.engines.contract.TOOLS_FIELD` (the JSON a chat template
takes, :func:`template_tools`), and a tool's result as ``TOOL_RESULT_FIELD``. A reply's
text is read by a :class:`ToolCallReader`: text outside a call is what the reply says;
a call streams as the model writes it (:class:`CallStarted` once its function's name is
written and offered, then :class:`CallArguments` pieces of its arguments' text) and is
checked once it closes (the :class:`~omni_actors.actors.engines.tool_calls.ToolCall`
that ends it). A call of a function not offered fails the reply before anything of it
is handed on; one that turns out malformed later (its JSON broken, never closed) fails
it after its start and part of its arguments were.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from omni_actors.actors.engines.tool_calls import (
    CallBody,
    MalformedToolCallError,
    Segment,
    ToolCall,
    ToolCallSplitter,
    check_offered,
)

__all__ = [
    "CallArguments",
    "CallStarted",
    "OfferedTool",
    "ReplyPiece",
    "ToolCallReader",
    "new_call_id",
    "template_tools",
]


@dataclass(frozen=True, slots=True)
class OfferedTool:
    """A function the model may call: its name, description and JSON Schema."""

    name: str
    description: str | None = None
    parameters: dict[str, object] | None = None


def template_tools(tools: Iterable[OfferedTool]) -> str:
    """The tools as the entry stage takes them: a JSON array in the chat-template form
    ``{"type": "function", "function": {...}}`` ("[]" for none)."""
    functions = []
    for tool in tools:
        function: dict[str, object] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
        functions.append({"type": "function", "function": function})
    return json.dumps(functions, ensure_ascii=False)


def new_call_id() -> str:
    """A new tool call's id (``call_…``, as OpenAI's)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class CallStarted:
    """A call began: the model wrote the name of ``name``, a function offered."""

    name: str


@dataclass(frozen=True, slots=True)
class CallArguments:
    """The next piece of the open call's arguments, as the model wrote it (JSON text)."""

    delta: str


ReplyPiece = str | CallStarted | CallArguments | ToolCall
"""What a reply's text is read as: said text (a ``str``), or part of a call: its start,
a piece of its arguments, its end (the checked call, whose ``arguments`` are the
pieces' text joined)."""


class ToolCallReader:
    """Reads one reply's text deltas: what it says, and the calls it makes as they stream.

    Each call is a :class:`CallStarted`, :class:`CallArguments` pieces (none for empty
    arguments) and the checked :class:`~omni_actors.actors.engines.tool_calls.ToolCall`,
    in that order; a body whose shape does not stream (see
    :class:`~omni_actors.actors.engines.tool_calls.CallBody`) gives all three when it
    closes.

    Args:
        names: the functions offered; a call of another fails the reply.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self._splitter = ToolCallSplitter()
        self._body: CallBody | None = None
        self.calls: list[ToolCall] = []

    @property
    def in_call(self) -> bool:
        """A call has started (:class:`CallStarted` was handed on) and not ended yet."""
        return self._body is not None and bool(self._body.name)

    def feed(self, text: str) -> list[ReplyPiece]:
        """The said text and the parts of calls ``text`` completes, in order.

        Raises:
            MalformedToolCallError: a call names a function not offered, or closed and
                cannot be made (its start and arguments may have been handed on).
        """
        return self._read(self._splitter.feed(text))

    def finish(self) -> list[ReplyPiece]:
        """The reply ended: the text still held back.

        Raises:
            MalformedToolCallError: a call was left open.
        """
        out = self._read(self._splitter.flush())
        if self._splitter.in_call:
            body = self._body.text.strip() if self._body is not None else ""
            raise MalformedToolCallError(
                f"the model's tool call was not closed with </tool_call>: {body!r}"
            )
        return out

    def _read(self, segments: Iterable[Segment]) -> list[ReplyPiece]:
        out: list[ReplyPiece] = []
        for segment in segments:
            kind, text = segment.kind, segment.text
            if kind == "said":
                out.append(text)
            elif kind == "open":
                self._body = CallBody()
            elif kind == "body":
                assert self._body is not None
                name, arguments = self._body.feed(text)
                if name is not None:
                    check_offered(name, self.names)
                    out.append(CallStarted(name))
                if arguments:
                    out.append(CallArguments(arguments))
            elif kind == "close":
                body, self._body = self._body, None
                assert body is not None
                call = body.close(self.names)
                if not body.name:
                    out.append(CallStarted(call.name))
                if rest := call.arguments[len(body.streamed) :]:
                    out.append(CallArguments(rest))
                self.calls.append(call)
                out.append(call)
        return out
