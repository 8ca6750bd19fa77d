"""Summarize a stage worker's py-spy samples (raw stacks, ``py-spy record --format raw
--threads --idle``): per thread, its samples and how many were idle (waiting in the
event loop's poll, a thread pool's queue, a lock or a sleep), then the project's,
asyncio's, msgspec's and pyzmq's frames among the busy ones, each counted once per
sample (inclusive), the most sampled first::

    python3 benchmarks/spy_summary.py spy_thinker_steps-1234.txt [TOP]

``benchmarks/spy_steps.sh`` records them during a traced run.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

_IDLE_LEAVES = (
    "select (",
    "epoll",
    "_worker (concurrent/futures/thread.py:8",
    "wait (threading.py",
    "Condition.wait",
    "sleep",
    "Runner.run (",  # uvloop's poll is native: the stack ends at the Python that ran it
    "run (uvloop",
)
_OURS = ("omni_actors", "asyncio", "msgspec", "zmq")


def summarize(lines: list[str]) -> dict[str, tuple[int, int, collections.Counter[str]]]:
    """By thread name: samples, idle samples, and busy samples per frame."""
    totals: collections.Counter[str] = collections.Counter()
    idle: collections.Counter[str] = collections.Counter()
    frames: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        head, _, rest = stack.partition(";")
        thread = re.sub(r"^thread \(\d+\): ", "", head)
        totals[thread] += n
        parts = rest.split(";") if rest else []
        if not parts or parts[-1].startswith(_IDLE_LEAVES):
            idle[thread] += n
            continue
        seen: set[str] = set()
        for frame in parts:
            where = re.search(r"\((.*?):\d+\)", frame)
            module = where.group(1) if where else ""
            if not any(word in module for word in _OURS):
                continue
            name = f"{re.sub(r' [(].*', '', frame)} [{module.rsplit('/', 1)[-1]}]"
            if name not in seen:
                seen.add(name)
                frames[thread][name] += n
    return {t: (total, idle[t], frames[t]) for t, total in totals.most_common()}


def main(path: str, top: int = 25) -> None:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for thread, (total, idle, frames) in summarize(lines).items():
        print(f"== {thread}: {total} samples, idle {idle} ({idle / total:.0%})")
        for name, n in frames.most_common(top):
            print(f"   {n:6d} {n / total:5.1%} {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
