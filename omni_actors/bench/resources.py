"""What a serving process and its workers hold: the counts a leak shows up in.

A fault must never leak memory, shared memory, file descriptors or processes; a long
run must hold as much after an hour as after two minutes. :func:`snapshot` reads, from
``/proc`` (Linux), what this process and every process below it hold at one moment:
open file descriptors, resident memory, the project's entries in ``/dev/shm``, live
child processes, and the asyncio tasks of the running loop. ``bench soak`` samples it
over time; the soak test compares two snapshots taken after the same kind of work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

from omni_actors.transport.shm import SHM_DIR, SHM_PREFIX

__all__ = ["Resources", "descendants", "snapshot", "tree_cpu_s"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class Resources:
    """One moment's holdings of a process tree (see the module docstring).

    Attributes:
        fds: open file descriptors, summed over the tree.
        shm: entries in ``/dev/shm`` that a process of the tree created (the transport's
            slabs whose receiver has not mapped them yet).
        children: live processes below this one.
        tasks: asyncio tasks of the loop that took the snapshot.
        rss: resident bytes of each process of the tree, by pid.
    """

    fds: int
    shm: int
    children: int
    tasks: int
    rss: dict[int, int] = field(default_factory=dict)

    @property
    def rss_total(self) -> int:
        """Resident bytes of the whole tree."""
        return sum(self.rss.values())

    def counts(self) -> dict[str, int]:
        """The four counts that must come back to where they were after the same work."""
        return {"fds": self.fds, "shm": self.shm, "children": self.children, "tasks": self.tasks}


def descendants(pid: int | None = None) -> list[int]:
    """The live processes below ``pid`` (default: this one), children first.

    Raises:
        OSError: there is no ``/proc`` here (not Linux).
    """
    root = os.getpid() if pid is None else pid
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
            # The command name is in parentheses and may hold spaces: read after it.
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] == "Z":  # a zombie holds nothing but its pid
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    frontier = [root]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # gone in between
        return 0


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _shm(tree: list[int]) -> int:
    """Slabs named by a process of ``tree`` (a name holds its creator's pid): another
    program's, or another run's, are not this tree's to answer for."""
    prefixes = tuple(f"{SHM_PREFIX}{pid}-" for pid in tree)
    try:
        return sum(1 for name in os.listdir(SHM_DIR) if name.startswith(prefixes))
    except OSError:
        return 0


def snapshot() -> Resources:
    """This process tree's holdings now; call it on the loop whose tasks count.

    Raises:
        OSError: there is no ``/proc`` here (not Linux).
    """
    tree = [os.getpid(), *descendants()]
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop
        tasks = 0
    return Resources(
        fds=sum(_fds(pid) for pid in tree),
        shm=_shm(tree),
        children=len(tree) - 1,
        tasks=tasks,
        rss={pid: _rss(pid) for pid in tree},
    )


def tree_cpu_s() -> float:
    """CPU seconds (user + system, every thread) used so far by this process and every
    live process below it: the difference of two readings is what a stretch of work
    cost the whole tree, workers included. A process that ended in between is missing
    from the second reading, so take both while the same processes live.

    Raises:
        OSError: there is no ``/proc`` here (not Linux).
    """
    total = time.process_time()
    for pid in descendants():
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total
