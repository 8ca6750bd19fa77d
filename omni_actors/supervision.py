"""Supervision vocabulary, after Erlang/OTP supervisors and Akka Typed.

A *supervisor* is any actor with children. Its :class:`SupervisorStrategy` decides what
happens to its children when one of them fails; each child's :data:`RestartType` says
whether that child is restarted at all:

- ``permanent`` — restarted after a failure *and* after it stops itself;
- ``transient`` — restarted after a failure only;
- ``temporary`` — never restarted (the default: an unsupervised failure stops the actor,
  as in Akka Typed).

When more than ``max_restarts`` restarts happen within ``period`` seconds the supervisor
gives up: it stops all its children and fails itself with
:class:`~omni_actors.errors.RestartIntensityExceededError`, escalating to its own parent.
"Within" is OTP's window, closed at both ends: a restart exactly ``period`` seconds
before the latest one still counts; only an older one no longer does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Backoff",
    "OverflowPolicy",
    "RestartType",
    "Strategy",
    "SupervisorStrategy",
]

RestartType = Literal["permanent", "transient", "temporary"]
"""Whether a child is restarted: see the module docstring."""

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
"""Which children restart together when one fails (OTP semantics)."""

OverflowPolicy = Literal["backpressure", "drop_oldest", "fail"]
"""What ``tell`` does when the mailbox is full."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter between consecutive restarts of one child.

    The n-th restart of a child within the intensity window waits
    ``min(max_s, min_s * factor**(n-1))`` seconds, stretched by a random factor in
    ``[1, 1 + jitter]`` so that siblings failing together do not restart in lockstep.
    """

    min_s: float = 0.01
    max_s: float = 5.0
    factor: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.min_s < 0 or self.max_s < self.min_s:
            raise ValueError(
                f"Backoff needs 0 <= min_s <= max_s, got min_s={self.min_s}, max_s={self.max_s}"
            )
        if self.factor < 1:
            raise ValueError(f"Backoff.factor must be >= 1, got {self.factor}")
        if self.jitter < 0:
            raise ValueError(f"Backoff.jitter must be >= 0, got {self.jitter}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before restart number ``attempt`` (1-based)."""
        base = min(self.max_s, self.min_s * self.factor ** max(0, attempt - 1))
        return base * (1.0 + self.jitter * rng.random())


@dataclass(frozen=True, slots=True)
class SupervisorStrategy:
    """How a supervisor treats its children's failures.

    Attributes:
        strategy: ``one_for_one`` restarts only the failed child; ``one_for_all``
            restarts every child; ``rest_for_one`` restarts the failed child and the
            children started after it.
        max_restarts: restart intensity: at most this many restarts ...
        period: ... within this many seconds, else the supervisor escalates (a restart
            exactly ``period`` seconds old still counts, as in OTP).
        backoff: delay before each restart.
        restart_timeout: deadline for a restarted child's ``on_start``.
    """

    strategy: Strategy = "one_for_one"
    max_restarts: int = 3
    period: float = 5.0
    backoff: Backoff = field(default_factory=Backoff)
    restart_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.strategy not in ("one_for_one", "one_for_all", "rest_for_one"):
            raise ValueError(
                f"unknown supervisor strategy {self.strategy!r}; use one_for_one, "
                "one_for_all or rest_for_one"
            )
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.period <= 0:
            raise ValueError(f"period must be > 0, got {self.period}")
