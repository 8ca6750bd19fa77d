"""A pipeline's stages as a directed graph: their order and what each reaches.

Every pipeline loaded is ordered and checked for stages its entry does not reach, and
every session asks which stages its request needs. Both are linear in stages and edges,
so a generated pipeline of thousands of stages costs milliseconds, not the minutes that
asking each stage for its downstream stages costs along a long chain.
Part of :mod:`omni_actors.pipeline.spec.pipeline`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

__all__ = ["StageGraph", "few"]


class StageGraph:
    """Stages named ``names`` joined by ``(source, to)`` edges between them."""

    def __init__(self, names: Sequence[str], edges: Iterable[tuple[str, str]]) -> None:
        self.names = list(names)
        self._following: dict[str, list[str]] = {name: [] for name in self.names}
        self._preceding: dict[str, list[str]] = {name: [] for name in self.names}
        for source, to in edges:
            self._following[source].append(to)
            self._preceding[to].append(source)

    def order(self) -> list[str]:
        """Every stage, each after the stages with edges into it; ties in declared order.

        Raises:
            ValueError: the stages form a cycle (the message names the stages on it).
        """
        incoming = {name: len(self._preceding[name]) for name in self.names}
        ready = deque(name for name in self.names if incoming[name] == 0)
        order: list[str] = []
        while ready:
            name = ready.popleft()
            order.append(name)
            for to in self._following[name]:
                incoming[to] -= 1
                if incoming[to] == 0:
                    ready.append(to)
        if len(order) != len(self.names):
            ordered = set(order)
            cyclic = sorted(name for name in self.names if name not in ordered)
            raise ValueError(f"the stages form a cycle through {few(cyclic)}")
        return order

    def downstream(self, name: str) -> set[str]:
        """Every stage reachable from ``name`` (``name`` only if it is on a cycle)."""
        return _reach([name], self._following)

    def upstream(self, names: Iterable[str]) -> set[str]:
        """Every stage from which one of ``names`` is reachable."""
        return _reach(list(names), self._preceding)


def _reach(starts: list[str], links: dict[str, list[str]]) -> set[str]:
    found: set[str] = set()
    frontier = list(starts)
    while frontier:
        for to in links.get(frontier.pop(), ()):
            if to not in found:
                found.add(to)
                frontier.append(to)
    return found


def few(names: list[str], shown: int = 10) -> str:
    """``names`` for a message, a long list cut to its first ``shown``."""
    more = f" and {len(names) - shown:,} more" if len(names) > shown else ""
    return f"{names[:shown]}{more}"
