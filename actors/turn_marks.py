"""Turn marks as a conversation engine reads them: a truncate mark's count, and when a
truncation may cut the last reply.

Every engine that keeps a conversation (tiny-omni's torch thinker, the ``vllm`` kind)
takes the same marks (:mod:`omni_actors.actors.engine`) and refuses the same bad
truncations, with the same messages: a caller (and the tests) reads one account of what
went wrong whichever thinker the pipeline runs. The checks live here; what a truncation
then does to an engine's state (crop a KV cache, cut a token list) stays the engine's.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from omni_actors.actors.engine import KEPT_FIELD, Fields
from omni_actors.errors import EngineError

__all__ = ["TurnMarkError", "check_truncatable", "kept_of"]

R = TypeVar("R")


class TurnMarkError(EngineError, ValueError):
    """A turn mark the session cannot take now: the message says what to send instead.

    A ``ValueError``, as an engine's refusal of bad input is everywhere (the stage
    answers a refused truncate rather than failing): an engine with an input error of
    its own re-raises it as that type with the same message.
    """


def kept_of(fields: Fields) -> int:
    """The ``kept`` count of a truncate mark: how many outputs of the last reply to keep.

    Raises:
        TurnMarkError: the mark has no ``kept``, or it is not a 0-d tensor.
    """
    kept = fields.get(KEPT_FIELD)
    if not isinstance(kept, torch.Tensor) or kept.numel() != 1:
        raise TurnMarkError(f"a truncate mark needs {KEPT_FIELD!r}: a 0-d tensor of tokens to keep")
    return int(kept)


def check_truncatable(reply: R | None, *, committed_after: bool, kept: int) -> R:
    """``reply`` if a truncation to its first ``kept`` outputs may cut it now.

    Only the last reply can be cut, and only before the conversation moved past it: a
    user turn committed after it was said to a reply the caller now says was not heard
    in full, so the caller must truncate first, then commit.

    Args:
        reply: the conversation's last reply; None when it has none (or the one it has
            is still being generated: it has no end to cut back from yet).
        committed_after: a user turn came after the reply (committed, or open: its
            prefill would sit behind the cut).
        kept: the outputs of the reply to keep.

    Raises:
        TurnMarkError: no reply, a user turn after it, or ``kept`` < 0.
    """
    if reply is None:
        raise TurnMarkError("the session has no reply to truncate")
    if committed_after:
        raise TurnMarkError(
            "a user turn was committed after the last reply: truncate the reply "
            "before committing new input"
        )
    if kept < 0:
        raise TurnMarkError(f"kept must be >= 0, got {kept}")
    return reply
