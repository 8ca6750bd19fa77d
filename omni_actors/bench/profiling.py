"""``bench ... --profile``: where the measured sections of a benchmark spend their CPU.

A :class:`Profiler` wraps :mod:`cProfile` and is switched on only around what a
benchmark measures (``with profiler.section():``), so start-up, warm-up and teardown
stay out of the figures. The event loop runs every task on one thread, so one section
sees the whole process's Python: the caller side, the stages, the transport.

It costs: a profiled run's latencies are not the run's latencies (cProfile roughly
doubles the CPU of small Python calls), so a report made with it says ``profiled``.
Worker processes are not in it: profile them from outside (``py-spy record --pid``).
The statistics file is :mod:`pstats`' own format (``python -m pstats FILE``).
"""

from __future__ import annotations

import contextlib
import cProfile
import pstats
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["Profiler"]


class Profiler:
    """One profile collected over any number of sections, written to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._profile = cProfile.Profile()
        self._depth = 0

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        """Profile the code run inside; nested sections count once."""
        self._depth += 1
        if self._depth == 1:
            self._profile.enable()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._profile.disable()

    def report(self, top: int = 25) -> dict[str, Any]:
        """Write the statistics to :attr:`path`; the ``top`` functions by own time.

        Returns:
            A JSON-ready dict: ``file`` (the statistics' path), ``total_s`` (profiled
            CPU), and ``top``: per function ``own_s`` (time in its own code), ``cum_s``
            (with what it called), ``calls`` and ``own_share`` of ``total_s``.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._profile.dump_stats(self.path)
        stats = pstats.Stats(str(self.path))
        table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # pstats' own table
        total = sum(own for _, _, own, _, _ in table.values()) or 1.0
        rows = sorted(table.items(), key=lambda item: item[1][2], reverse=True)[:top]
        return {
            "file": str(self.path),
            "total_s": round(total, 3),
            "top": [
                {
                    "function": _name(key),
                    "own_s": round(own, 4),
                    "cum_s": round(cum, 4),
                    "calls": calls,
                    "own_share": round(own / total, 4),
                }
                for key, (_, calls, own, cum, _) in rows
            ],
        }


def _name(key: tuple[str, int, str]) -> str:
    """``file:line(function)``, the file shortened to the part under a package root."""
    filename, line, function = key
    if filename == "~":  # a built-in
        return function
    parts = Path(filename).parts
    for root in ("omni_actors", "actors", "protocols", "site-packages", "asyncio"):
        if root in parts:
            parts = parts[parts.index(root) :]
            break
    return f"{'/'.join(parts)}:{line}({function})"
