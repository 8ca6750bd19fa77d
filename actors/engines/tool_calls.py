"""Tool calls in a reply's text: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.

Qwen's chat templates (and Hermes-format models) teach the model to call a tool by
writing a JSON object between ``<tool_call>`` and ``</tool_call>`` in its reply. The reply
streams as text deltas, and a marker may arrive split over several of them (a tokenizer
without the marker as one token spells it piece by piece), so :class:`ToolCallSplitter`
reads the deltas in order and says which text is said and which belongs to a call,
holding back only a tail that could still begin a marker.

Two readers share it, so they agree on every span: the entry stage, which keeps a call's
outputs from the stages after it (a tool call is never spoken), and the server, which
turns a call into the API's function-call events. The server reads a call's body as it
streams (:class:`CallBody`): its function's name as soon as the model has written it,
then its arguments' text as the model writes it, and checks the whole call once it
closes (:func:`parse_tool_call`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final, Literal

from omni_actors.errors import EngineError

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "CallBody",
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
    check_offered(name, names)
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


def check_offered(name: str, names: frozenset[str] | set[str]) -> None:
    """Refuse a call of ``name`` unless it is one of the functions offered, ``names``.

    Raises:
        MalformedToolCallError: it is not.
    """
    if name not in names:
        offered = ", ".join(sorted(names)) or "none"
        raise MalformedToolCallError(
            f"the model called {name!r}, which is not one of the tools offered ({offered})"
        )


# The start of a body as Qwen writes it, up to its name: ``{"name": "get_weather"``.
_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')
# What follows the name up to the arguments' value: ``, "arguments": ``.
_ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:\s*')


class CallBody:
    """One call's body as it streams: its name once written, then its arguments' text.

    Qwen writes the name first and the arguments as a JSON object after it,
    ``{"name": "get_weather", "arguments": {"city": "Paris"}}``: :meth:`feed` tells the
    name as soon as its closing quote is read, then the arguments object's text as it
    arrives, following its strings and brackets so that it stops where the object ends
    (the ``}`` that closes the body is not part of it). A body in another shape (other
    keys first, arguments written as JSON text) tells its name, or its arguments, only
    at :meth:`close`. Nothing is checked while it streams: a call that ends malformed is
    refused at :meth:`close`, after its name and part of its arguments were told.

    Attributes:
        name: the function's name, once the model has written it.
        streamed: the arguments' text told so far.
    """

    __slots__ = ("_at", "_depth", "_end", "_escaped", "_in_string", "_text", "name", "streamed")

    def __init__(self) -> None:
        self._text = ""
        self.name: str | None = None
        self.streamed = ""
        self._at: int | None = None  # where the arguments object begins in the body
        self._end: int | None = None  # where it ended (once it has)
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> tuple[str | None, str]:
        """Read ``text``, the next of the body: the name if it completes it (else None),
        and the arguments' text it adds ("" for none)."""
        start = len(self._text)
        self._text += text
        named: str | None = None
        if self.name is None:
            match = _NAME.match(self._text)
            if match is None:
                return None, ""
            try:
                name = json.loads(match.group(1))
            except ValueError:
                name = None
            if not isinstance(name, str) or not name:
                self.name = ""  # told at close, if the body turns out well formed
                return None, ""
            self.name = named = name
            start = match.end()
        if not self.name:
            return None, ""
        if self._at is None:
            match = _ARGUMENTS.match(self._text, self._name_end())
            if match is None or match.end() == len(self._text):
                return named, ""
            if self._text[match.end()] != "{":
                self._at = -1  # not an object: told at close
                return named, ""
            self._at = start = match.end()
        if self._at < 0 or self._end is not None:
            return named, ""
        added = self._scan(max(start, self._at))
        self.streamed += added
        return named, added

    @property
    def text(self) -> str:
        """The body read so far."""
        return self._text

    def _name_end(self) -> int:
        match = _NAME.match(self._text)
        assert match is not None
        return match.end()

    def _scan(self, start: int) -> str:
        """The arguments' text from ``start`` on, up to where the object ends."""
        text = self._text
        for i in range(start, len(text)):
            char = text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._end = i + 1
                    return text[start : i + 1]
        return text[start:]

    def close(self, names: frozenset[str] | set[str]) -> ToolCall:
        """The body is whole: the call it makes. Its arguments are the text told
        (:attr:`streamed`) when they streamed, else the arguments as JSON text.

        Raises:
            MalformedToolCallError: the call cannot be made (:func:`parse_tool_call`),
                or the name or arguments told are not the ones it makes (the body
                names them twice).
        """
        call = parse_tool_call(self._text, names)
        streamed = self._end is not None
        if (self.name and self.name != call.name) or (
            streamed and json.loads(self.streamed) != json.loads(call.arguments)
        ):
            raise MalformedToolCallError(
                f"the model's call of {call.name!r} names its function or its arguments "
                f"more than once: {self._text.strip()!r}"
            )
        if not streamed:
            return call
        return ToolCall(call.name, self.streamed)
