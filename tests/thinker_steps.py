"""Driving a thinker engine through a conversation by hand, as a stage session would:
input items and turn marks, and what its outputs say. Shared by the tiny-omni and the
vLLM thinkers' tests, which drive their engines through the same conversations."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

import torch

from omni_actors.actors.engines.contract import KEPT_FIELD, REPLY_FIELD, TURN_FIELD, Fields
from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD

COMMIT: Fields = {TURN_FIELD: "commit"}
HI: Fields = {"text": "Hi"}
AND: Fields = {"text": "And then?"}

Step = Fields | Callable[[], Awaitable[None]]
"""An input item, or something to run (and maybe fail) before the next one."""


def truncate(kept: int) -> Fields:
    """A truncate mark as a stage's ``SegmentInputs`` hands it to the engine."""
    return {TURN_FIELD: "truncate", KEPT_FIELD: torch.tensor(kept)}


def reply(tokens: Sequence[int]) -> Fields:
    """A reply mark as a stage's ``SegmentInputs`` hands it to the engine."""
    return {TURN_FIELD: "reply", REPLY_FIELD: torch.tensor(list(tokens), dtype=torch.int64)}


async def items(steps: Iterable[Step]) -> AsyncIterator[Fields]:
    """The input stream of ``steps``: their items, running the callables between."""
    for step in steps:
        if callable(step):
            await step()
        else:
            yield step


async def respond(engine: Any, session: str, *steps: Step) -> list[Fields]:
    """Every output of one ``generate`` of ``session`` over ``steps``."""
    return [out async for out in engine.generate(session, items(steps))]


class OneShot:
    """Input items that say, as a stage's ``SegmentInputs`` do (``all_read``), when the
    item handed out is the last: the reply is asked for with it, as a one-shot request."""

    def __init__(self, steps: Sequence[Fields]) -> None:
        self._items = iter(steps)
        self._left = len(steps)
        self.all_read = False

    def __aiter__(self) -> OneShot:
        return self

    async def __anext__(self) -> Fields:
        fields = next(self._items, None)
        if fields is None:
            raise StopAsyncIteration
        self._left -= 1
        self.all_read = self._left == 0
        return fields


async def broken() -> None:
    """A step that breaks the input stream."""
    raise RuntimeError("input broke")


def tensor(fields: Fields, name: str) -> torch.Tensor:
    value = fields[name]
    assert isinstance(value, torch.Tensor), name
    return value


def ids(outputs: list[Fields]) -> list[int]:
    """The token ids a response yielded, in order."""
    return [int(tensor(o, "token_ids")) for o in outputs if "token_ids" in o]


def user_rows(outputs: list[Fields]) -> torch.Tensor:
    """Every ``user`` row the talker got, in order."""
    return torch.cat([tensor(o, "user") for o in outputs if "user" in o])


def talker_rows(outputs: Iterable[Fields], field: str = "user") -> torch.Tensor:
    """The ``user`` rows (or ``user_mask`` entries: ``field``) the talker keeps of
    ``outputs``: each output's ``user_edits`` applied in order (``+n`` rows join, ``-m``
    the last ``m`` go; rows without edits all join), row by row."""
    kept: list[torch.Tensor] = []
    for out in outputs:
        rows = out.get(field)
        edits = out.get(USER_EDITS_FIELD)
        count = rows.shape[0] if isinstance(rows, torch.Tensor) else 0
        at = 0
        for n in [count] if not isinstance(edits, torch.Tensor) else edits.tolist():
            if n > 0:
                assert isinstance(rows, torch.Tensor)
                kept.extend(rows[at : at + n])
                at += n
            elif n < 0:
                assert len(kept) >= -n, "more rows taken back than were sent"
                del kept[n:]
        assert at == count, "every row sent is counted by the edits"
    return torch.stack(kept) if kept else torch.zeros(0)
