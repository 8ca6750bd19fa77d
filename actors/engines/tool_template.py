"""Tools in a conversation, as token ids rendered by the model's own chat template.

A conversation engine feeds its model one piece at a time, so it never renders a whole
conversation: it needs the pieces that tools add, each as the release's chat template
writes it (Qwen's: a ``# Tools`` block with ``<tools></tools>`` in the system turn, a
tool's result as ``<tool_response>`` in a user turn, the assistant's calls as
``<tool_call>`` blocks). :class:`ToolTemplate` renders each piece around a sentinel
content and splits there, as :class:`~omni_actors.actors.engines.vllm.turns.TurnTemplate`
does for plain turns: the template's own text is encoded with its special tokens, and
what the caller wrote (instructions, a result) with the engine's ``encode``, in which a
special token's spelling stays text. No model's strings are written here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from omni_actors.errors import EngineError

__all__ = ["ToolTemplate", "ToolTemplateError"]

_SENTINEL = "\x00omni-actors-tool\x00"
_OTHER = "\x00omni-actors-other\x00"


class ToolTemplateError(EngineError, ValueError):
    """The model's chat template cannot render tools, or the tool input is malformed."""


class ToolTemplate:
    """The tool pieces of one tokenizer's chat template (module docstring).

    Args:
        tokenizer: a transformers tokenizer with its chat template set.
        encode: how the engine encodes the caller's text (special tokens kept as text).
        remedy: what to do when the template renders no tools (a release to rebuild).
    """

    def __init__(
        self, tokenizer: Any, encode: Callable[[str], list[int]], *, remedy: str = ""
    ) -> None:
        self.tokenizer = tokenizer
        self.encode = encode
        self.remedy = remedy

    def _render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        if not isinstance(text, str):
            raise ToolTemplateError("the chat template did not render text")
        return text

    def _ids(self, text: str) -> list[int]:
        """The template's own text, its special tokens recognized."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    def _around(self, text: str, content: str) -> list[int]:
        """``text`` with the sentinel replaced by ``content`` (the caller's), as ids."""
        before, found, after = text.partition(_SENTINEL)
        if not found:
            raise ToolTemplateError("the chat template dropped a tool message's content")
        return [*self._ids(before), *self.encode(content), *self._ids(after)]

    def system_turn(self, instructions: str, tools: str) -> tuple[int, ...]:
        """The system turn that sets ``instructions`` and offers ``tools`` (a JSON array
        of ``{"type": "function", "function": {...}}``); as without tools when none.

        Raises:
            ToolTemplateError: ``tools`` is not such an array, or the template renders no
                tools.
        """
        functions = _functions(tools)
        if not functions:
            return ()
        if instructions:
            text = self._render([{"role": "system", "content": _SENTINEL}], tools=functions)
            ids = self._around(text, instructions)  # the system turn alone
        else:
            # No system message: the template writes the tools' system turn alone, before
            # the first turn (a user turn here, cut off).
            text = self._render([{"role": "user", "content": _SENTINEL}], tools=functions)
            plain = self._render([{"role": "user", "content": _SENTINEL}])
            if not text.endswith(plain):
                raise ToolTemplateError(
                    "the chat template writes tools inside the user turn; it needs a "
                    "system turn of their own"
                )
            ids = self._ids(text[: len(text) - len(plain)])
        rendered = self.tokenizer.decode(ids)
        names = [f["function"]["name"] for f in functions]
        if not all(name in rendered for name in names):
            raise ToolTemplateError(
                f"the model's chat template does not render tools (its system turn names "
                f"none of {', '.join(names)}); serve a release whose template takes "
                f"`tools`{'; ' + self.remedy if self.remedy else ''}"
            )
        return tuple(ids)

    def tool_result(self, result: str, *, first: bool) -> list[int]:
        """A tool's result as the template writes it in a user turn, after the turn's
        opening (``first``) or after another result.

        Raises:
            ToolTemplateError: the template does not write a tool message as part of a
                user turn.
        """
        user = self._render([{"role": "user", "content": _SENTINEL}])
        opening, _, closing = user.partition(_SENTINEL)
        if first:
            text = self._render([{"role": "tool", "content": _SENTINEL}])
            skip = opening
        else:
            before = self._render([{"role": "tool", "content": _OTHER}])
            text = self._render(
                [{"role": "tool", "content": _OTHER}, {"role": "tool", "content": _SENTINEL}]
            )
            skip = before[: len(before) - len(closing)]
        if not (text.startswith(skip) and text.endswith(closing)):
            raise ToolTemplateError(
                "the chat template does not write a tool's result inside a user turn "
                f"({text!r}); this engine streams results into user turns"
            )
        return self._around(text[len(skip) : len(text) - len(closing)], result)

    def tool_calls_turn(self, message: str) -> tuple[int, ...]:
        """The content of an assistant turn that called tools, as the template writes
        it between the turn's opening and its close (the reply's tokens).

        Args:
            message: ``{"content": str | null, "tool_calls": [...]}`` (JSON text).

        Raises:
            ToolTemplateError: ``message`` is not such an object, or the template writes
                no calls.
        """
        try:
            parsed = json.loads(message)
        except ValueError as exc:
            raise ToolTemplateError(f"tool calls must be a JSON object ({exc})") from None
        calls = parsed.get("tool_calls") if isinstance(parsed, dict) else None
        if not isinstance(calls, list) or not calls:
            raise ToolTemplateError('tool calls must be {"content": ..., "tool_calls": [...]}')
        content = parsed.get("content") or ""
        if not isinstance(content, str):
            raise ToolTemplateError("an assistant turn's content must be text")
        plain = self._render([{"role": "assistant", "content": _SENTINEL}])
        opening, _, closing = plain.partition(_SENTINEL)
        text = self._render([{"role": "assistant", "content": content, "tool_calls": calls}])
        if not (text.startswith(opening) and text.endswith(closing)):
            raise ToolTemplateError("the chat template does not write tool calls in the turn")
        return tuple(self.encode(text[len(opening) : len(text) - len(closing)]))


def _functions(tools: str) -> list[dict[str, Any]]:
    try:
        parsed = json.loads(tools)
    except ValueError as exc:
        raise ToolTemplateError(f"tools must be a JSON array ({exc})") from None
    if not isinstance(parsed, list) or not all(
        isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in parsed
    ):
        raise ToolTemplateError(
            'tools must be a JSON array of {"type": "function", "function": {"name": ...}}'
        )
    return parsed
