"""``CellState``: where an actor's cell is in its life."""

from __future__ import annotations

import enum

__all__ = ["CellState"]


class CellState(enum.Enum):
    """Where a cell is in its life; it only moves forward, except suspend/restart."""

    STARTING = "starting"
    """``on_start`` of the first instance is running."""
    RUNNING = "running"
    """Handling messages."""
    SUSPENDED = "suspended"
    """Failed; its supervisor decides (user messages are stashed meanwhile)."""
    STOPPING = "stopping"
    """Terminating: children stopped, ``on_stop`` runs."""
    STOPPED = "stopped"
    """Gone for good; the mailbox is closed."""

    @property
    def ending(self) -> bool:
        """True while stopping or once stopped: no new children, no restart."""
        return self in (CellState.STOPPING, CellState.STOPPED)
