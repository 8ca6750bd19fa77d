"""``Steps``: a benchmark that runs for minutes says which of its steps is under way.

A bench coroutine takes ``progress`` (a :data:`Progress`; None, the default, says
nothing) and reports each step as it starts: its name, its number and how many there
are. A step that lasts a set time (a soak's conversations, the faults of a chaos run)
reports again as its time passes, under the same number. The CLI passes one that
writes a line to stderr (``omni_actors.cli.progress.StepLines``), as stdout carries the
report itself.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Progress", "Steps"]

Progress = Callable[[str, int, int], None]
"""``progress(step, number, total)``: step ``number`` (from 1) of ``total`` is under way."""


class Steps:
    """Numbers a benchmark's steps as they start and hands them to ``progress``.

    Args:
        progress: where the steps go (None: nowhere).
        total: how many steps the run has (each :meth:`start` is one).
    """

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.number = 0  # the step under way; 0 before the first

    def start(self, step: str) -> None:
        """The next step, named ``step``, starts."""
        self.number += 1
        self.update(step)

    def update(self, step: str) -> None:
        """The step under way, again (``step`` says how far it is)."""
        if self.progress is not None:
            self.progress(step, self.number, self.total)
