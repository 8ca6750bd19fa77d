"""Per-session input state of a stage: named payload fields merged by declared rules.

A stage declares, per field, how arriving chunks combine: ``concat`` (the default:
token ids and hidden states grow along dim 0, text grows by appending) or ``replace``
(only the latest value matters, e.g. a speaker embedding). The stage declares it —
there is no global table to keep in sync.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from omni_actors.errors import OmniError
from omni_actors.protocols.control import AccumulateRule

__all__ = ["Accumulator", "ChunkGapError", "ChunkSequence"]

Value = torch.Tensor | str


class Accumulator:
    """Merges the fields of successive chunks of one session.

    Concatenation is lazy: pieces are kept and joined once when read, so a long stream of
    small chunks costs O(n), not O(n²).
    """

    def __init__(
        self, rules: Mapping[str, AccumulateRule] | None = None, default: AccumulateRule = "concat"
    ) -> None:
        for name, rule in {**(rules or {}), "<default>": default}.items():
            if rule not in ("concat", "replace"):
                raise ValueError(
                    f"field {name!r}: rule must be 'concat' or 'replace', not {rule!r}"
                )
        self.rules = dict(rules or {})
        self.default = default
        self._pieces: dict[str, list[Value]] = {}

    def add(self, fields: Mapping[str, Value]) -> None:
        """Merge one chunk's fields."""
        for name, value in fields.items():
            pieces = self._pieces.get(name)
            if pieces is None or self.rules.get(name, self.default) == "replace":
                self._pieces[name] = [value]
                continue
            if type(value) is not type(pieces[0]) and not (
                isinstance(value, torch.Tensor) and isinstance(pieces[0], torch.Tensor)
            ):
                raise TypeError(
                    f"field {name!r}: cannot concat {type(value).__name__} onto "
                    f"{type(pieces[0]).__name__}"
                )
            pieces.append(value)

    def get(self, name: str) -> Value | None:
        """The merged value of ``name`` (None if no chunk carried it)."""
        pieces = self._pieces.get(name)
        if not pieces:
            return None
        if len(pieces) > 1:
            first = pieces[0]
            joined: Value = (
                torch.cat(pieces)  # type: ignore[arg-type]
                if isinstance(first, torch.Tensor)
                else "".join(pieces)  # type: ignore[arg-type]
            )
            pieces[:] = [joined]
        return pieces[0]

    def snapshot(self) -> dict[str, Value]:
        """Every field, merged."""
        return {name: value for name in self._pieces if (value := self.get(name)) is not None}

    def clear(self) -> None:
        """Forget everything (session finished or aborted)."""
        self._pieces.clear()


class ChunkGapError(OmniError):
    """A chunk arrived after a missing one: the stream cannot be reassembled."""

    code = "chunk_gap"

    def __init__(self, stream: str, expected: int, got: int) -> None:
        super().__init__(f"{stream}: expected chunk {expected}, got {got}; chunks were lost")
        self.expected = expected
        self.got = got


class ChunkSequence:
    """Checks the sequence numbers of one stream: duplicates dropped, gaps are errors."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.next = 0

    def accept(self, seq: int) -> bool:
        """True for the next chunk, False for a duplicate of one already accepted.

        Raises:
            ChunkGapError: ``seq`` skips ahead.
        """
        if seq < self.next:
            return False
        if seq > self.next:
            raise ChunkGapError(self.stream, self.next, seq)
        self.next += 1
        return True
