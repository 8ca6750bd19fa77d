"""``benchmarks/spy_summary.py``: a worker's py-spy samples by thread, idle ones (the
event loop's poll, a pool waiting for work) apart, the project's frames counted once per
sample however deep they recur."""

from __future__ import annotations

from types import ModuleType

from bench_scripts import load_script


def _script() -> ModuleType:
    return load_script("spy_summary")


LOOP = (
    "thread (7): MainThread;main (omni_actors/_system.py:216);Runner.run (asyncio/runners.py:118)"
)
POOL = "thread (9): torch-thinker_0;Thread.run (threading.py:982)"
STEP = "BusyClock.run (omni_actors/actors/engines/torch_engine.py:205)"


def test_idle_samples_are_apart_and_frames_count_once_per_sample() -> None:
    lines = [
        f"{LOOP} 40",  # the loop waiting in its poll
        f"{LOOP};StepLoop._step (omni_actors/actors/engines/step_loop.py:450) 6",
        f"{LOOP};f (omni_actors/a.py:1);g (omni_actors/b.py:2);f (omni_actors/a.py:9) 4",
        f"{POOL};_worker (concurrent/futures/thread.py:81) 30",
        f"{POOL};{STEP};matmul (torch/functional.py:5) 20",
        "not a sample line",
    ]

    found = _script().summarize(lines)

    total, idle, frames = found["MainThread"]
    assert (total, idle) == (50, 40)
    assert frames["StepLoop._step [step_loop.py]"] == 6
    assert frames["f [a.py]"] == 4  # twice in one stack: counted once
    assert frames["main [_system.py]"] == 10
    total, idle, frames = found["torch-thinker_0"]
    assert (total, idle) == (50, 30)
    assert frames["BusyClock.run [torch_engine.py]"] == 20
    assert "matmul [functional.py]" not in frames  # torch's own frames are left out
    assert sorted(found) == ["MainThread", "torch-thinker_0"]
