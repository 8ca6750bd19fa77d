"""Step marks: the event recorded right after the step that made a tensor, so that a
copy of the tensor waits for that step and for nothing queued after it.

A GPU engine computes in its model thread on its device's current stream, and the stage
sends a step's outputs from its event loop. By the time the loop copies them (into a
device link's slot, or to the host) the model thread has often queued the next step,
another batch's forward, on that same stream: a copy that waited on the stream as the
loop finds it would wait behind that forward too. So the model thread records an event
on its stream right after each call and marks the tensors the call returned with it
(:func:`mark_step`); a copy of marked tensors waits on their marks only
(:func:`wait_ready`). The mark is kept on the tensor's storage, so every view of it
made later (a session's row of a batch, made on the loop) carries it too, and memory
the allocator hands out again comes with a new storage, unmarked.

Tensors concatenated on the loop (a step's rows of many sessions, packed into one
tensor) would be new memory, unmarked: :func:`cat_ready` concatenates them on a stream of
the stage's own once their marks say they are ready, and marks the result with an event
recorded right after the concatenation, so a copy of it waits for its parts' steps and
the concatenation, not for the stream the loop finds.

A tensor without a mark (made on the loop, or by code that marks nothing) makes the
copy wait on the stream it is given, everything queued there so far, as before: slower
under load, never early. A mark says the tensor is final when the event completes; a
tensor written again later is marked again by the call that writes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import msgspec
import torch

__all__ = ["Waits", "cat_ready", "mark_step", "step_mark", "wait_ready"]

_MARK = "_omni_step_ready"
_DEPTH = 4  # containers nested this deep are searched: [Fed(rows, (token, embed))]


class Waits(Protocol):
    """What :func:`wait_ready` orders: ``torch.cuda.Stream`` is one."""

    def wait_event(self, event: Any) -> None:
        """Queue a wait for ``event``."""

    def wait_stream(self, stream: Any) -> None:
        """Queue a wait for everything queued on ``stream`` so far."""


def _tensors(value: object, depth: int) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif depth <= 0:
        return
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item, depth - 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item, depth - 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A step's outputs are often records (a thinker chunk's rows and token): their
        # tensors unmarked, every copy of them would wait behind the next step.
        for item in dataclasses.fields(value):
            yield from _tensors(getattr(value, item.name), depth - 1)
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            yield from _tensors(getattr(value, name), depth - 1)


def mark_step(
    result: object, device: torch.device, record: Callable[[], object] | None = None
) -> object | None:
    """Mark the tensors on ``device`` in ``result`` (a tensor, or mappings, lists, tuples,
    dataclasses and msgspec structs of them, a few levels deep) with one event recorded
    after the step.

    Call it on the thread that queued the step, right after it. ``record`` makes the
    event (default: a new event recorded on the thread's current stream of ``device``);
    it is called only when there is a tensor to mark.

    Returns:
        The event, or None when nothing was marked.
    """
    event = None
    for tensor in _tensors(result, _DEPTH):
        if tensor.device != device:
            continue
        if event is None:
            event = record() if record is not None else _recorded(device)
        # The storage's Python object lives as long as the memory and is the same for
        # every view of it (torch keeps one per storage).
        setattr(tensor.untyped_storage(), _MARK, event)
    return event


def _recorded(device: torch.device) -> object:
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    return event


def step_mark(tensor: torch.Tensor) -> object | None:
    """The mark of ``tensor``'s memory (None if the step that made it marked nothing)."""
    return getattr(tensor.untyped_storage(), _MARK, None)


def wait_ready(stream: Waits, tensors: Iterable[torch.Tensor], fallback: Any) -> bool:
    """Make ``stream`` wait until ``tensors`` are ready: on their marks if every one has
    one, else on everything queued on ``fallback`` so far.

    Returns:
        Whether the marks were enough (False: the wait is on ``fallback``).
    """
    marks: list[object] = []
    for tensor in tensors:
        mark = step_mark(tensor)
        if mark is None:
            stream.wait_stream(fallback)
            return False
        if not any(mark is seen for seen in marks):
            marks.append(mark)
    for mark in marks:
        stream.wait_event(mark)
    return True


def cat_ready(
    parts: Sequence[torch.Tensor],
    stream: Waits,
    fallback: Any,
    record: Callable[[], object] | None = None,
) -> torch.Tensor:
    """``parts`` concatenated along dim 0 by work queued on ``stream`` once they are
    ready (:func:`wait_ready`: their marks, else everything queued on ``fallback``),
    the result marked with an event recorded on ``stream`` right after (``record``
    makes it; default: a new event on the current stream, which is ``stream`` then).

    ``stream`` is a ``torch.cuda.Stream`` for device tensors (the concatenation runs on
    it, and the allocator keeps each part until it has read them); anything else orders
    only the waits, as in tests on the CPU.
    """
    wait_ready(stream, parts, fallback)
    cuda = stream if isinstance(stream, torch.cuda.Stream) else None
    with torch.cuda.stream(cuda) if cuda is not None else contextlib.nullcontext():
        packed = torch.cat(list(parts))
        event = record() if record is not None else _recorded(packed.device)
    if cuda is not None:
        for part in parts:
            part.record_stream(cuda)
    setattr(packed.untyped_storage(), _MARK, event)
    return packed
