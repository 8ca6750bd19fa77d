"""``TorchEngine.busy_s``: the model thread's time in model calls, loading excluded, a
call under way counted as far as it got; and what a stage reports of it."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from omni_actors.actors.engines.contract import engine_busy_s
from omni_actors.actors.engines.torch_engine import BusyClock, TorchEngine
from omni_actors.testing import eventually

LOAD_S = 0.05


def spin(seconds: float) -> float:
    """Compute (not sleep) for ``seconds``: the thread is busy all along."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return seconds


class Spinning(TorchEngine):
    def _load(self, path: Path) -> None:
        spin(LOAD_S)  # a load that takes time: it is not serving


async def test_busy_seconds_count_model_calls_and_not_the_load() -> None:
    engine = Spinning(Path("unused"), "spinning")
    assert engine.busy_s == 0.0
    await engine.start()
    try:
        assert engine.busy_s == 0.0  # the load's LOAD_S are not counted
        started = time.perf_counter()
        await engine.call(spin, 0.03)
        await engine.call(spin, 0.02)
        wall = time.perf_counter() - started
        busy = engine.busy_s
        assert 0.05 <= busy <= wall
        assert engine.busy_s == busy  # idle: nothing more is counted
        assert engine_busy_s(engine) == busy
    finally:
        await engine.stop()


async def test_a_call_under_way_counts_as_far_as_it_got() -> None:
    engine = Spinning(Path("unused"), "spinning")
    await engine.start()
    release = threading.Event()
    try:
        call = asyncio.ensure_future(engine.call(release.wait, 5.0))
        first = await eventually(lambda: engine.busy_s)
        await eventually(lambda: engine.busy_s > first, what="the running call's time grows")
        release.set()
        assert await call is True
        done = engine.busy_s
        assert engine.busy_s == done
    finally:
        release.set()
        await engine.stop()


def test_busy_clock_adds_the_time_of_each_call_and_passes_results_and_errors() -> None:
    clock = BusyClock()
    assert clock.run(lambda: spin(0.01)) == 0.01
    try:
        clock.run(lambda: 1 / 0)
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("the call's error must pass through")
    assert clock.seconds >= 0.01


def test_an_engine_that_does_not_tell_reports_none() -> None:
    class Scripted:
        pass

    class Odd:
        busy_s = True  # not a number of seconds

    assert engine_busy_s(Scripted()) is None
    assert engine_busy_s(Odd()) is None
