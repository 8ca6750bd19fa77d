"""What one thread of a stage worker did over a stretch of a traced run, in order: its
py-spy samples (``benchmarks/spy_steps.sh`` with ``SPY_TIMELINE=1``: a speedscope file)
grouped into runs of the same innermost frames, each run's start (ms from
``spy_start.txt``, the step traces' clock) and length::

    python3 benchmarks/spy_timeline.py spy_thinker_steps-1234.json MainThread FROM_MS TO_MS [DEPTH]

Set FROM/TO from the step trace (its ``t`` minus the start): a wave's first prefill
step, say, to see whether the event loop or the model thread held it up. Runs shorter
than 4 ms are left out. (py-spy attaches a little after the start: times are late by
up to a few tens of ms.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_SHORTEST_S = 0.004


def runs(
    profile: dict[str, Any], frames: list[dict[str, Any]], lo: float, hi: float, depth: int
) -> list[list[Any]]:
    """(start s, length s, frames) per run of equal innermost ``depth`` frames."""
    out: list[list[Any]] = []
    t = 0.0
    for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
        if lo <= t <= hi:
            names = [
                f"{frames[i]['name']}:{frames[i].get('line', '')}@"
                f"{Path(frames[i].get('file', '')).name}"
                for i in stack[-depth:]
            ]
            key = " < ".join(reversed(names))
            if out and out[-1][2] == key:
                out[-1][1] += weight
            else:
                out.append([t, weight, key])
        t += weight
    return out


def main() -> None:
    path, thread, lo_ms, hi_ms = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    depth = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    data = json.loads(Path(path).read_text())
    frames = data["shared"]["frames"]
    for profile in data["profiles"]:
        if thread not in profile["name"]:
            continue
        print(f"## {profile['name']}")
        for start, length, key in runs(profile, frames, lo_ms / 1e3, hi_ms / 1e3, depth):
            if length >= _SHORTEST_S:
                print(f"{start * 1e3:8.0f} {length * 1e3:6.0f}  {key}")


if __name__ == "__main__":
    main()
