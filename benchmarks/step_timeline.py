"""Where each session's first audio waits, from the step loops' traces of a run.

Run a pipeline with ``OMNI_ACTORS_STEP_TRACE=DIR`` (every step loop, in every worker
process, writes its steps to ``DIR``: ``actors/engines/step_loop.py``), then::

    python3 benchmarks/step_timeline.py DIR

For each session (by the time its prompt's prefill started), in ms from that start:
when the thinker's step that ends its prompt ended (its first token), when its first
decode step ended (the second token), when the talker's first prefill of it started and
its last prefill before its first frame row ended (its user rows, then the reply's
opening, which makes frame 0), when its third frame row ended (frame 3: the first
packet's four frames), and when code2wav's first window of it ended. Then the medians,
and for each stage the share of its time in steps with prefill chunks. Then which stage
paced the replies: per session, the thinker's decode rows (tokens, ms between them) and
the talker's frame rows while the thinker was still decoding that session (each frame
takes one of its tokens, so there the thinker sets the pace) and after it (the talker
alone), with the median ms between two frames in each phase; their medians over the
sessions are printed. Last, the slow
steps: those that took more than twice the median of their shape (stage, decode rows
in eights, and each prefill chunk's length and whether it starts its slot) and at least
20 ms more, each with the other stages' steps that ran meanwhile: a step that waits on
another stage's device work lasts as long as that stage's step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def load(directory: Path) -> list[dict[str, Any]]:
    """Every step of every trace file in ``directory``, by start time."""
    steps = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                steps.append(json.loads(line))
    return sorted(steps, key=lambda step: step["t"])


def stage_of(step: dict[str, Any]) -> str:
    """The stage a step loop serves: its name's first word (``thinker steps``)."""
    name: str = step["loop"]
    return name.split()[0]


def sessions(steps: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each session's milestones (module docstring), in Unix seconds."""
    events: dict[str, dict[str, list[tuple[str, float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for step in steps:
        stage, start = stage_of(step), step["t"]
        end = start + step["ms"] / 1e3
        for request in step["decode"]:
            events[request][stage].append(("decode", start, end))
        for request, _, _ in step["prefill"]:
            events[request][stage].append(("prefill", start, end))
    found: dict[str, dict[str, float]] = {}
    for request, by_stage in events.items():
        thinker = by_stage.get("thinker", [])
        prefills = [e for e in thinker if e[0] == "prefill"]
        if not prefills:
            continue
        marks = {"start": prefills[0][1]}
        first_decode = next((e for e in thinker if e[0] == "decode"), None)
        before = [e for e in prefills if first_decode is None or e[1] < first_decode[1]]
        marks["first_token"] = before[-1][2]
        if first_decode is not None:
            marks["second_token"] = first_decode[2]
        talker = by_stage.get("talker", [])
        talker_prefills = [e for e in talker if e[0] == "prefill"]
        frames = [e for e in talker if e[0] == "decode"]
        if talker_prefills:
            marks["talker_rows"] = talker_prefills[0][1]
            opening = [e for e in talker_prefills if not frames or e[1] < frames[0][1]]
            if opening:
                marks["opening"] = opening[-1][2]
        if len(frames) >= 3:
            marks["frame_3"] = frames[2][2]
        code2wav = by_stage.get("code2wav", [])
        if code2wav:
            marks["first_window"] = code2wav[0][2]
        found[request] = marks
    return found


def _spacing(ends: list[float]) -> float | None:
    """The median ms between consecutive times (Unix seconds); None for fewer than two."""
    if len(ends) < 2:
        return None
    return statistics.median((b - a) * 1e3 for a, b in itertools.pairwise(ends))


def reply_phases(steps: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each session's reply pace (module docstring): its thinker tokens and talker frames
    while the thinker decoded it and after, with the median ms between two of each."""
    ends: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for step in steps:
        end = step["t"] + step["ms"] / 1e3
        for request in step["decode"]:
            ends[request][stage_of(step)].append(end)
    found: dict[str, dict[str, float | None]] = {}
    for request, by_stage in ends.items():
        tokens, frames = by_stage.get("thinker", []), by_stage.get("talker", [])
        if len(tokens) < 2 or not frames:
            continue
        during = [end for end in frames if end <= tokens[-1]]
        after = [end for end in frames if end > tokens[-1]]
        found[request] = {
            "tokens": len(tokens),
            "token_ms": _spacing(tokens),
            "frames_during": len(during),
            "frame_ms_during": _spacing(during),
            "frames_after": len(after),
            "frame_ms_after": _spacing(after),
        }
    return found


def pace_medians(phases: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """Each figure of :func:`reply_phases` as its median over the sessions that have it."""
    keys = ("tokens", "token_ms", "frames_during", "frame_ms_during", "frames_after")
    medians: dict[str, float | None] = {}
    for key in (*keys, "frame_ms_after"):
        values = [value for phase in phases.values() if (value := phase[key]) is not None]
        medians[key] = round(statistics.median(values), 2) if values else None
    return medians


def shape_of(step: dict[str, Any]) -> tuple[Any, ...]:
    """What a step's time mostly depends on: its stage, its decode rows (in eights) and
    its prefill chunks (each one's length, and whether it starts its slot)."""
    chunks = sorted((start == 0, length) for _, start, length in step["prefill"])
    return stage_of(step), len(step["decode"]) // 8, tuple(chunks)


def slow_steps(steps: list[dict[str, Any]], limit: int = 30) -> list[dict[str, Any]]:
    """Steps over twice their shape's median and 20 ms more (module docstring), those
    the longest over it first, at most ``limit``; times in ms from the first step."""
    by_shape: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for step in steps:
        by_shape[shape_of(step)].append(step["ms"])
    medians = {shape: statistics.median(times) for shape, times in by_shape.items()}
    origin = steps[0]["t"] if steps else 0.0
    found = []
    for step in steps:
        usual = medians[shape_of(step)]
        if step["ms"] <= 2 * usual or step["ms"] < usual + 20:
            continue
        start, end = step["t"], step["t"] + step["ms"] / 1e3
        meanwhile = [
            f"{stage_of(other)} {(other['t'] - origin) * 1e3:.0f}+{other['ms']:.0f}"
            for other in steps
            if stage_of(other) != stage_of(step)
            and other["t"] < end
            and other["t"] + other["ms"] / 1e3 > start
            and other["ms"] >= 20
        ]
        found.append(
            {
                "stage": stage_of(step),
                "at_ms": round((start - origin) * 1e3, 1),
                "ms": round(step["ms"], 1),
                "usual_ms": round(usual, 1),
                "decode_rows": len(step["decode"]),
                "prefill": [[start_, length] for _, start_, length in step["prefill"]],
                "meanwhile": meanwhile,
            }
        )
    return sorted(found, key=lambda slow: slow["usual_ms"] - slow["ms"])[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    ns = parser.parse_args()
    steps = load(ns.directory)
    found = sessions(steps)
    columns = [
        "first_token",
        "second_token",
        "talker_rows",
        "opening",
        "frame_3",
        "first_window",
    ]
    rows = []
    for request, marks in sorted(found.items(), key=lambda item: item[1]["start"]):
        start = marks["start"]
        row = {"session": request, "start_s": round(start - steps[0]["t"], 3)}
        row.update({c: round((marks[c] - start) * 1e3, 1) for c in columns if c in marks})
        rows.append(row)
    medians = {
        c: round(statistics.median(r[c] for r in rows if c in r), 1)
        for c in columns
        if any(c in r for r in rows)
    }
    busy: dict[str, dict[str, float]] = defaultdict(lambda: {"prefill_s": 0.0, "decode_s": 0.0})
    for step in steps:
        kind = "prefill_s" if step["prefill"] else "decode_s"
        busy[stage_of(step)][kind] += step["ms"] / 1e3
    slow = slow_steps(steps)
    phases = reply_phases(steps)
    paces = pace_medians(phases)
    if ns.json:
        print(
            json.dumps(
                {"sessions": rows, "medians": medians, "busy": busy, "paces": paces, "slow": slow}
            )
        )
        return
    print("session  start s  " + "  ".join(f"{c:>12}" for c in columns) + "   (ms from start)")
    for row in rows:
        cells = "  ".join(f"{row.get(c, float('nan')):>12.1f}" for c in columns)
        print(f"{row['session'][-8:]:>8} {row['start_s']:>8.3f}  {cells}")
    print(
        "median            " + "  ".join(f"{medians.get(c, float('nan')):>12.1f}" for c in columns)
    )
    for stage, times in busy.items():
        print(
            f"{stage}: {times['prefill_s']:.2f} s in steps with prefill, "
            f"{times['decode_s']:.2f} s in the others"
        )
    print(
        f"reply pace (median of {len(phases)} sessions): {paces['tokens']} thinker tokens, "
        f"{paces['token_ms']} ms apart; talker frames while the thinker decodes: "
        f"{paces['frames_during']}, {paces['frame_ms_during']} ms apart; after: "
        f"{paces['frames_after']}, {paces['frame_ms_after']} ms apart"
    )
    print("slow steps (at ms: ms against the usual of their shape; other stages meanwhile)")
    for step in slow:
        chunks = " ".join(f"{start}+{length}" for start, length in step["prefill"])
        print(
            f"  {step['stage']} at {step['at_ms']:.0f}: {step['ms']:.0f} ms (usual "
            f"{step['usual_ms']:.0f}), {step['decode_rows']} decode rows, prefill [{chunks}]; "
            f"meanwhile: {', '.join(step['meanwhile']) or '-'}"
        )


if __name__ == "__main__":
    main()
