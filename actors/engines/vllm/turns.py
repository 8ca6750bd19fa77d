"""``TurnTemplate``: a conversation's turns as token ids, read off the model's chat template.

A streaming conversation engine never renders a whole conversation: it appends one turn
at a time (the user's as it arrives, a system turn, the assistant's opening) to a request
that stays open. So it needs each role's turn as *prefix + content + suffix* token ids.
Rendering the tokenizer's own chat template around a sentinel content and splitting there
gives them for any model that ships a template (Qwen's ``<|im_start|>user\\n``), with no
table of model-specific strings here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_actors.errors import EngineError

__all__ = ["ChatTemplateError", "Turn", "TurnTemplate"]

_SENTINEL = "\x00omni-actors-turn\x00"


class ChatTemplateError(EngineError, ValueError):
    """The model's tokenizer has no chat template this engine can split into turns."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One role's turn: ``prefix`` + content + ``suffix``, as token ids."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TurnTemplate:
    """The turns of the chat template of one tokenizer.

    Attributes:
        system: a system turn (instructions).
        user: a user turn.
        assistant: an assistant turn; its ``suffix`` closes a reply.
        opening: what opens the assistant's reply (the generation prompt).
    """

    system: Turn
    user: Turn
    assistant: Turn
    opening: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer: Any) -> TurnTemplate:
        """Read the turns off ``tokenizer``'s chat template (a transformers tokenizer).

        Raises:
            ChatTemplateError: no template, or one that does not render a lone turn of
                each role as ``prefix + content + suffix``.
        """
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                "the model's tokenizer has no chat template; a conversation engine needs one "
                "to know how turns are written (save one with the tokenizer)"
            )

        def render(role: str, *, opening: bool = False) -> str:
            messages = [{"role": role, "content": _SENTINEL}]
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=opening
            )
            if not isinstance(text, str) or text.count(_SENTINEL) != 1:
                raise ChatTemplateError(
                    f"the chat template does not render a lone {role} turn around its content"
                )
            return text

        def ids(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False))

        def turn(role: str) -> Turn:
            before, _, after = render(role).partition(_SENTINEL)
            return Turn(ids(before), ids(after))

        plain = render("user")
        prompted = render("user", opening=True)
        if not prompted.startswith(plain):
            raise ChatTemplateError("the chat template's generation prompt does not follow a turn")
        return cls(turn("system"), turn("user"), turn("assistant"), ids(prompted[len(plain) :]))
