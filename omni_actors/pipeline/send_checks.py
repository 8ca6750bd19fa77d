"""What a caller's ``Session.send`` may carry, checked before anything is queued.

Input that the entry stage cannot take must fail at the call that sent it, with an
``InvalidRequestError`` that says what was wrong, and leave the session as it was: a
field the entry engine does not declare would otherwise be dropped without a word in
one process and end the session in another (the receiving worker refuses to decode
it); a tensor the wire cannot carry would fail inside the transport after the send's
credit was spent; an input of a gigabyte would be held whole by every stage on its way.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

import torch

from omni_actors.actors.engines.contract import KEPT_FIELD, REPLY_FIELD, TURN_FIELD
from omni_actors.errors import InvalidRequestError
from omni_actors.protocols.tensors import MAX_DIMS, TORCH_NAMES

__all__ = ["check_send"]

_SESSION_FIELDS = frozenset({TURN_FIELD, KEPT_FIELD, REPLY_FIELD})
"""Turn marks and what they carry: the session sends them, never as a caller's field."""


def check_send(
    session: str,
    *,
    text: object,
    audio: object,
    fields: Mapping[Any, object],
    takes: Set[str],
    limit: int,
) -> None:
    """Refuse a send the entry stage cannot take.

    Args:
        session: the session's id, for the message.
        text: ``send``'s ``text`` (None: none).
        audio: ``send``'s ``audio``, made a tensor (``audio_tensor``; None: none; its
            shape and samples are the resampler's to check).
        fields: ``send``'s named ``fields``.
        takes: the fields the entry stage's engine declares.
        limit: ``inputs.max_send_bytes``.

    Raises:
        InvalidRequestError: ``text`` is not a string; a field's name is not a string or
            not one the entry stage takes; a field's value is neither a string nor a
            dense CPU tensor of a dtype the wire carries; the send is larger than
            ``limit`` (tensor bytes plus text characters).
    """
    named: dict[object, object] = dict(fields)
    if text is not None:
        if not isinstance(text, str):
            raise InvalidRequestError(f"text must be a str, not {type(text).__name__}")
        named["text"] = text
    if audio is not None:
        named["audio"] = audio
    size = 0
    for name, value in named.items():
        if not isinstance(name, str):
            raise InvalidRequestError(f"field names must be str, got {name!r}")
        if name in _SESSION_FIELDS:
            raise InvalidRequestError(
                f"field {name!r} is the session's own: use commit, clear, truncate or respond"
            )
        if name not in takes:
            raise InvalidRequestError(
                f"the entry stage takes no field {name!r}; it takes: {', '.join(sorted(takes))}"
            )
        if isinstance(value, str):
            size += len(value)  # characters: what the text costs at least
        elif isinstance(value, torch.Tensor):
            _check_tensor(name, value)
            size += value.numel() * value.element_size()
        else:
            raise InvalidRequestError(
                f"field {name!r} must be a str or a torch.Tensor, not {type(value).__name__}"
            )
    if size > limit:
        raise InvalidRequestError(
            f"session {session}: a send of {size} bytes is larger than "
            f"inputs.max_send_bytes ({limit}); send it in pieces"
        )


def _check_tensor(name: str, tensor: torch.Tensor) -> None:
    if tensor.layout != torch.strided:
        raise InvalidRequestError(f"field {name!r}: a {tensor.layout} tensor; send a dense one")
    if tensor.device.type != "cpu":
        raise InvalidRequestError(
            f"field {name!r} is on {tensor.device}: send host tensors (a stage moves its "
            "inputs to its own device, on its own stream)"
        )
    if tensor.dtype not in TORCH_NAMES:
        raise InvalidRequestError(f"field {name!r}: dtype {tensor.dtype} cannot be sent")
    if tensor.dim() > MAX_DIMS:
        raise InvalidRequestError(
            f"field {name!r} has {tensor.dim()} dimensions; at most {MAX_DIMS}"
        )
