"""The thinker stage's port contract: the fields every thinker engine takes and yields.

A pipeline's talker follows whichever thinker the pipeline runs (tiny-omni's torch
thinker, the ``vllm`` kind), so both declare these same ports: the edge check compares
the talker's declaration with one contract, not with each engine's copy of it. The
mappings are read-only; an engine states them as its ``inputs`` and ``outputs`` (and
``streams_input = True``: a thinker prefills its input as it arrives).

Inputs, any of them per chunk:

- ``text``: str, appended to the open user turn.
- ``audio``: float32 1-D, 16 kHz mono, appended to the open user turn (in a chunk with
  text, before it). An engine that cannot hear refuses it with an error that says so.
- ``turn``: a turn mark (``commit``, ``clear``, ``truncate`` with ``kept``, ``reply``
  with ``reply``; see :mod:`omni_actors.actors.engines.contract`).
- ``reply``: with a ``reply`` mark, the token ids of an earlier reply to take back as
  the assistant's turn (a session replaying its conversation): every thinker is
  ``Replayable``.
- ``instructions``: str, the conversation's system prompt from then on (in a chunk with
  text or audio, before them).
- ``tools``: str, the tools offered from then on (JSON), rendered with the
  instructions into the system turn by the release's chat template; ``tool_result``:
  str, a tool's result in the open user turn; ``tool_calls``: str, an earlier assistant
  turn that called tools, taken back as the assistant's turn (see
  :mod:`omni_actors.actors.engines.contract`).

Outputs:

- ``token_ids`` [1] int64, ``text`` (what the token adds to the reply's text) and
  ``embed`` [1, H] float32 (the token's input embedding: the talker's text input for
  it), one of each per generated token.
- ``user`` [n, H] float32 and ``user_mask`` [n] bool: per position of a user turn
  (``<|im_start|> user \\n … <|im_end|> \\n``) the thinker's input embedding, or where
  the mask is True (audio placeholders) its hidden state at the layer the talker reads.
  A thinker sends them when the turn is committed at the latest; one that sends
  ``user_edits`` sends them as they become final, while the turn is still being spoken
  (text as it arrives, audio window by window as it is encoded), so the talker
  prefills the turn before it ends.
- ``user_edits`` [k] int64 (:data:`USER_EDITS_FIELD`), from a thinker that sends rows
  before the commit, with each of its row outputs (or alone, to take rows back): how
  the output changes the talker's user rows, in order. ``+n``: the next ``n`` rows
  of ``user`` join them; ``-m``: the last ``m`` rows sent in this response go (the open
  turn was cleared, or a truncation fed it again behind the cut reply, which changes
  its rows at audio placeholders: they are sent again). Concatenated, as ``user`` is,
  so a ``full`` edge's one chunk replays the edits in order. Without it, every row
  sent joins the talker's (a thinker that sends a turn's rows once it is committed).
- ``opening`` [3, H] (the embeddings of ``<|im_start|> assistant \\n``) and ``tts``
  [3, H] float32 (those of TTS_BOS, TTS_EOS, TTS_PAD), once per reply with its first
  token: ``replace``, as the talker takes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from omni_actors.actors.engines.contract import (
    INSTRUCTIONS_FIELD,
    REPLY_FIELD,
    TOOL_CALLS_FIELD,
    TOOL_RESULT_FIELD,
    TOOLS_FIELD,
    TURN_FIELD,
    Rule,
)

__all__ = ["THINKER_INPUTS", "THINKER_OUTPUTS", "USER_EDITS_FIELD"]

USER_EDITS_FIELD: Final = "user_edits"
"""The thinker's output that says how its ``user`` rows change the talker's (module
docstring)."""

THINKER_INPUTS: Final[Mapping[str, Rule]] = MappingProxyType(
    {
        "text": "concat",
        "audio": "concat",
        TURN_FIELD: "concat",
        REPLY_FIELD: "concat",
        INSTRUCTIONS_FIELD: "concat",
        TOOLS_FIELD: "concat",
        TOOL_RESULT_FIELD: "concat",
        TOOL_CALLS_FIELD: "concat",
    }
)
"""What a thinker takes (module docstring), with each field's accumulate rule."""

THINKER_OUTPUTS: Final[Mapping[str, Rule]] = MappingProxyType(
    {
        "token_ids": "concat",
        "text": "concat",
        "embed": "concat",
        # Rows of user turns, sent as they become final (with edits) or on commit.
        "user": "concat",
        "user_mask": "concat",
        USER_EDITS_FIELD: "concat",
        # Sent once per reply, with its first token.
        "opening": "replace",
        "tts": "replace",
    }
)
"""What a thinker yields (module docstring), with each field's accumulate rule."""
