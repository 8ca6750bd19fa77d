"""The server's side of tools: what the entry stage is given, and what a reply calls.

Both APIs offer function tools the same way to the pipeline: the entry stage gets them
as :data:`~omni_actors.actors.engines.contract.TOOLS_FIELD` (the JSON a chat template
takes, :func:`template_tools`), and a tool's result as ``TOOL_RESULT_FIELD``. A reply's
text is read by a :class:`ToolCallReader`: text outside a call is what the reply says;
a call is checked once it closes and handed on whole (its arguments in one piece), so
a malformed call fails the reply before anything of it reaches the client.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from omni_actors.actors.engines.tool_calls import (
    MalformedToolCallError,
    Segment,
    ToolCall,
    ToolCallSplitter,
    parse_tool_call,
)

__all__ = ["OfferedTool", "ToolCallReader", "new_call_id", "template_tools"]


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


class ToolCallReader:
    """Reads one reply's text deltas: what it says, and the calls it makes.

    Args:
        names: the functions offered; a call of another fails the reply.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self._splitter = ToolCallSplitter()
        self._body: list[str] = []
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[str | ToolCall]:
        """The said text and the calls ``text`` completes, in order.

        Raises:
            MalformedToolCallError: a call closed that cannot be made.
        """
        return self._read(self._splitter.feed(text))

    def finish(self) -> list[str | ToolCall]:
        """The reply ended: the text still held back.

        Raises:
            MalformedToolCallError: a call was left open.
        """
        out = self._read(self._splitter.flush())
        if self._splitter.in_call:
            body = "".join(self._body).strip()
            raise MalformedToolCallError(
                f"the model's tool call was not closed with </tool_call>: {body!r}"
            )
        return out

    def _read(self, segments: Iterable[Segment]) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        for segment in segments:
            kind, text = segment.kind, segment.text
            if kind == "said":
                out.append(text)
            elif kind == "body":
                self._body.append(text)
            elif kind == "close":
                body, self._body = "".join(self._body), []
                call = parse_tool_call(body, self.names)
                self.calls.append(call)
                out.append(call)
        return out
