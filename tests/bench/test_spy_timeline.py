"""``benchmarks/spy_timeline.py``: a thread's py-spy samples in order, as runs of the same
innermost frames, each with its start and length, only within the stretch asked for."""

from __future__ import annotations

from bench_scripts import load_script

FRAMES = [
    {"name": "run", "file": "/x/asyncio/runners.py", "line": 118},
    {"name": "encode", "file": "/x/vocabulary.py", "line": 162},
    {"name": "to_host", "file": "/x/staging.py", "line": 151},
]
LOOP, ENCODE, COPY = [0], [0, 1], [0, 2]


def test_samples_group_into_runs_within_the_stretch() -> None:
    profile = {
        "samples": [LOOP, ENCODE, ENCODE, COPY, COPY, COPY, LOOP, ENCODE],
        "weights": [0.002] * 8,
    }
    found = load_script("spy_timeline").runs(profile, FRAMES, 0.002, 0.012, 1)
    assert [(round(t * 1e3), round(w * 1e3), key) for t, w, key in found] == [
        (2, 4, "encode:162@vocabulary.py"),
        (6, 6, "to_host:151@staging.py"),
        (12, 2, "run:118@runners.py"),
    ]
    deeper = load_script("spy_timeline").runs(profile, FRAMES, 0.0, 0.004, 2)
    assert deeper[1][2] == "encode:162@vocabulary.py < run:118@runners.py"
