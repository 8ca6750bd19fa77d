"""Tool calls in a reply's text: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.

Qwen's chat templates (and Hermes-format models) teach the model to call a tool by
writing a JSON object between ``<tool_call>`` and ``</tool_call>`` in its reply. The reply
streams as text deltas, and a marker may arrive split over several of them (a tokenizer
without the marker as one token spells it piece by piece), so :class:`ToolCallSplitter`
reads the deltas in order and says which text is said and which belongs to a call,
holding back only a tail that could still begin a marker.

Two readers share it, so they agree on every span: the entry stage, which keeps a call's
outputs from the stages after it (a tool call is never spoken), and the server, which
turns a call into the API's function-call events once it is closed and checked
(:func:`parse_tool_call`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final, Literal

from omni_actors.errors import EngineError

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "MalformedToolCallError",
    "Segment",
    "ToolCall",
    "ToolCallSplitter",
    "parse_tool_call",
]

TOOL_CALL_OPEN: Final = "<tool_call>"
TOOL_CALL_CLOSE: Final = "</tool_call>"

SegmentKind = Literal["said", "open", "body", "close"]


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of reply text: ``said`` (spoken text), or part of a call: its ``open`` and
    ``close`` markers and the ``body`` between them."""

    kind: SegmentKind
    text: str

    @property
    def said(self) -> bool:
        """Whether the text is spoken (outside every call)."""
        return self.kind == "said"


class ToolCallSplitter:
    """Splits a reply's text deltas into said text and tool calls (module docstring).

    Attributes:
        in_call: a call is open (its opening marker was read, its closing one not yet).
    """

    __slots__ = ("_held", "in_call")

    def __init__(self) -> None:
        self._held = ""
        self.in_call = False

    @property
    def holding(self) -> bool:
        """Text is held back: it may begin the next marker."""
        return bool(self._held)

    def feed(self, text: str) -> list[Segment]:
        """The segments ``text`` completes, in order (held text first)."""
        buffer = self._held + text
        out: list[Segment] = []
        while buffer:
            marker = TOOL_CALL_CLOSE if self.in_call else TOOL_CALL_OPEN
            at = buffer.find(marker)
            if at < 0:
                keep = _marker_prefix(buffer, marker)
                self._add(out, "body" if self.in_call else "said", buffer[: len(buffer) - keep])
                buffer = buffer[len(buffer) - keep :]
                break
            self._add(out, "body" if self.in_call else "said", buffer[:at])
            self._add(out, "close" if self.in_call else "open", marker)
            self.in_call = not self.in_call
            buffer = buffer[at + len(marker) :]
        self._held = buffer
        return out

    def flush(self) -> list[Segment]:
        """The reply ended: the held text, as what it was (no marker came of it)."""
        held, self._held = self._held, ""
        out: list[Segment] = []
        self._add(out, "body" if self.in_call else "said", held)
        return out

    @staticmethod
    def _add(out: list[Segment], kind: SegmentKind, text: str) -> None:
        if text:
            out.append(Segment(kind, text))


def _marker_prefix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class MalformedToolCallError(EngineError):
    """The model wrote a tool call that cannot be made: not JSON, no name, or a name the
    caller did not offer. The reply fails closed: nothing of it is called or spoken."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A checked tool call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


def parse_tool_call(body: str, names: frozenset[str] | set[str]) -> ToolCall:
    """The call whose text between the markers is ``body``.

    Args:
        body: the JSON object the model wrote: ``{"name": ..., "arguments": {...}}``
            (``arguments`` may be JSON text, as some models write it).
        names: the functions the caller offered.

    Raises:
        MalformedToolCallError: ``body`` is not such an object, or names another function.
    """
    try:
        call = json.loads(body)
    except ValueError as exc:
        raise MalformedToolCallError(
            f"the model wrote a tool call that is not valid JSON ({exc}): {body.strip()!r}"
        ) from None
    if not isinstance(call, dict):
        raise MalformedToolCallError(
            f"the model wrote a tool call that is not a JSON object: {body.strip()!r}"
        )
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedToolCallError(
            f"the model wrote a tool call without a function name: {body.strip()!r}"
        )
    if name not in names:
        offered = ", ".join(sorted(names)) or "none"
        raise MalformedToolCallError(
            f"the model called {name!r}, which is not one of the tools offered ({offered})"
        )
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise MalformedToolCallError(
                f"the model's call of {name!r} has arguments that are not JSON ({exc})"
            ) from None
    if not isinstance(arguments, dict):
        raise MalformedToolCallError(
            f"the model's call of {name!r} has arguments that are not a JSON object"
        )
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))
