"""``bench chaos`` and ``bench soak`` on tiny-omni for minutes (``make test-slow``): the
counts the benchmarks' targets stand on — no hung turn, no conversation lost, nothing
left behind — with real models in worker processes being killed."""

from __future__ import annotations

import pytest

from omni_actors.bench.chaos import ChaosConfig, run_chaos_bench
from omni_actors.bench.soak import prepared, run_soak_bench

pytestmark = pytest.mark.slow

NOTHING = {"fds": 0, "shm": 0, "children": 0, "tasks": 0}


async def test_chaos_on_tiny_omni_loses_no_conversation_and_leaves_nothing() -> None:
    config = ChaosConfig(sessions=8, seconds=60, kill_every_s=15, disconnect_p=0.05)
    result = await run_chaos_bench(prepared("tiny-omni", None, 0), config, label="tiny-omni")
    assert result["kills"], "no worker was killed"
    assert result["hung"] == 0, result["turns"]
    assert result["conversations_lost"] == 0, result["turns"]
    assert result["turns"].get("completed", 0) > 0
    assert result["leaked"] == NOTHING


async def test_a_soak_on_tiny_omni_completes_every_turn_and_leaves_nothing() -> None:
    result = await run_soak_bench(
        prepared("tiny-omni", None, 0),
        sessions=8,
        minutes=3,
        interval_s=10,
        warmup_minutes=1,
        label="tiny-omni",
    )
    assert set(result["outcomes"]) == {"completed"}
    assert result["leaked"] == NOTHING
