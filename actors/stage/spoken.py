"""``SpokenOutputs``: which of an entry engine's outputs the stages after it may voice.

An entry engine that takes tools (it declares ``TOOLS_FIELD``) may write a tool call in
its reply's text. The call is for the caller, never for the listener: its outputs still
reach the caller (who reads the call out of the text), but the stages after the entry
(the talker) get none of the reply's stream for them, so nothing of a call is spoken.

What an output *sets* (a field the engine declares ``replace``, such as the thinker's
per-reply ``opening``) still goes on without the rest: a reply that opens with a call
and speaks after it must still open. What an output *adds* to the reply (``concat``: a
token, its text, its embedding) does not.

A marker may be split over several outputs, so an output whose text could still begin
one is held back, in order with what follows it, until the text says what it was; the
reply's end releases what is held. An output with text of a call in it is spoken only
when it also says something (text outside every call and marker, not only blanks).
"""

from __future__ import annotations

from collections.abc import Collection

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.tool_calls import Segment, ToolCallSplitter

__all__ = ["SpokenOutputs"]


class SpokenOutputs:
    """One segment's filter of an entry engine's outputs (module docstring).

    Args:
        kept: the fields that go on from an output that is not spoken (the engine's
            ``replace`` outputs).
    """

    __slots__ = ("_held", "_kept", "_splitter")

    def __init__(self, kept: Collection[str]) -> None:
        self._kept = frozenset(kept)
        self._splitter = ToolCallSplitter()
        # output, chars not yet read, says something, has call text
        self._held: list[tuple[Fields, int, bool, bool]] = []

    def feed(self, output: Fields) -> list[Fields]:
        """What to send on now, in order, for the engine's next ``output``."""
        text = output.get("text")
        if not isinstance(text, str) or not text:
            if self._held:  # behind held text: in order
                self._held.append((output, 0, False, self._splitter.in_call))
                return []
            if not self._splitter.in_call:
                return [output]
            unspoken = self._unspoken(output)
            return [unspoken] if unspoken else []
        self._held.append((output, len(text), False, False))
        self._read(self._splitter.feed(text))
        return self._release()

    def flush(self) -> list[Fields]:
        """The reply ended: what is still held, to send on now."""
        self._read(self._splitter.flush())
        return self._release(end=True)

    def _read(self, segments: list[Segment]) -> None:
        """Mark the held outputs whose characters ``segments`` cover, in order."""
        held = self._held
        index = 0
        for segment in segments:
            size = len(segment.text)
            while size:
                while held[index][1] == 0:
                    index += 1
                output, left, said, call = held[index]
                taken = min(left, size)
                part = segment.text[len(segment.text) - size :][:taken]
                said = said or (segment.said and not part.isspace())
                held[index] = (output, left - taken, said, call or not segment.said)
                size -= taken

    def _release(self, *, end: bool = False) -> list[Fields]:
        """The held outputs whose text is all read, from the first, as they go on."""
        out: list[Fields] = []
        held = self._held
        while held and (held[0][1] == 0 or end):
            output, _, said, call = held.pop(0)
            out.append(output if said or not call else self._unspoken(output))
        return [o for o in out if o]

    def _unspoken(self, output: Fields) -> Fields:
        kept = self._kept
        return {k: v for k, v in output.items() if k in kept}
