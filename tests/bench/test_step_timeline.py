"""``benchmarks/step_timeline.py``'s slow steps: a step far over its shape's usual time is
listed with the other stages' steps that ran meanwhile; steps of its usual time, and
another shape's longer ones, are not."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from bench_scripts import load_script


def _script() -> ModuleType:
    return load_script("step_timeline")


def _step(loop: str, t: float, ms: float, decode: int = 0, prefill: Any = ()) -> dict[str, Any]:
    rows = [f"s{i}" for i in range(decode)]
    return {"t": t, "ms": ms, "loop": loop, "decode": rows, "prefill": [list(p) for p in prefill]}


def test_a_step_far_over_its_shapes_usual_time_is_listed_with_what_ran_meanwhile() -> None:
    timeline = _script()
    frames = [_step("talker steps", 0.03 * i, 10.0, decode=4) for i in range(9)]
    waiting = _step("talker steps", 0.30, 150.0, decode=4)  # waits on the thinker's step
    prompt = _step("thinker steps", 0.29, 160.0, decode=3, prefill=[("a", 0, 2503)])
    prompts = [
        _step("thinker steps", 1 + 0.2 * i, 165.0, decode=3, prefill=[("b", 0, 2503)])
        for i in range(3)
    ]
    user_rows = [  # the talker's prefill: another shape, longer as a rule
        _step("talker steps", 2 + 0.1 * i, 60.0, decode=4, prefill=[("c", 0, 2503)])
        for i in range(3)
    ]
    steps = sorted([*frames, waiting, prompt, *prompts, *user_rows], key=lambda step: step["t"])

    slow = timeline.slow_steps(steps)

    assert [(s["stage"], s["ms"], s["usual_ms"]) for s in slow] == [("talker", 150.0, 10.0)]
    assert slow[0]["at_ms"] == 300.0
    assert slow[0]["meanwhile"] == ["thinker 290+160"]
    assert slow[0]["decode_rows"] == 4
    assert slow[0]["prefill"] == []


def test_reply_pace_splits_frames_at_the_thinkers_last_token() -> None:
    timeline = _script()
    # Session a: five tokens 10 ms apart, a frame after each (paced by the tokens), then
    # three frames 7 ms apart. Session b: no frames, skipped.
    tokens = [_step("thinker steps", 0.010 * i, 2.0, decode=1) for i in range(5)]
    lone = _step("thinker steps", 0.2, 2.0)
    lone["decode"] = ["b", "b"]
    during = [_step("talker steps", 0.010 * i + 0.003, 1.0, decode=1) for i in range(5)]
    after = [_step("talker steps", 0.050 + 0.007 * i, 1.0, decode=1) for i in range(3)]
    for step in [*tokens, *during, *after]:
        step["decode"] = ["a"]
    steps = sorted([*tokens, lone, *during, *after], key=lambda step: step["t"])

    phases = timeline.reply_phases(steps)

    assert list(phases) == ["a"]
    pace = phases["a"]
    assert (pace["tokens"], pace["frames_during"], pace["frames_after"]) == (5, 4, 4)
    assert round(pace["token_ms"], 3) == 10.0
    assert round(pace["frame_ms_during"], 3) == 10.0
    # The fifth frame ends after the last token: the talker's own pace from there on.
    assert round(pace["frame_ms_after"], 3) == 7.0
    medians = timeline.pace_medians(phases)
    assert medians["tokens"] == 5
    assert medians["frame_ms_during"] == 10.0
