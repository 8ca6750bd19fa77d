"""A one-line progress bar on stderr (the CLI is the only place that prints)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


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
