"""Progress on stderr (the CLI is the only place that prints): a bar for work of known
size, a line per step for benchmarks; stdout stays the command's output."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar", "StepLines"]


class ProgressBar:
    """``bar(step, done, total)`` redraws ``label [#####.....] done/total step``.

    On a terminal the line is redrawn in place; otherwise (logs, CI) each update is a
    line of its own.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None, width: int = 24) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.started = time.monotonic()
        self._tty = self.stream.isatty()

    def __call__(self, step: str, done: int, total: int) -> None:
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.started
        line = f"{self.label} [{bar}] {done}/{total} {step} ({elapsed:.1f}s)"
        end = "\n" if not self._tty or done >= total else ""
        self.stream.write(("\r" if self._tty else "") + line + end)
        self.stream.flush()


class StepLines:
    """``lines(step, number, total)`` writes ``label: step (number/total)...`` and the time
    since the start, a line each.

    For benchmarks made of steps whose length is not known ahead
    (:class:`omni_actors.bench.steps.Steps`): never redrawn, so a log keeps every line.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.started = time.monotonic()

    def __call__(self, step: str, number: int, total: int) -> None:
        elapsed = time.monotonic() - self.started
        self.stream.write(f"{self.label}: {step} ({number}/{total})... [{elapsed:.0f} s]\n")
        self.stream.flush()
