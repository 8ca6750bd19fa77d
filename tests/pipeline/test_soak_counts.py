"""The suite's short soak: after 200 conversations through worker processes, the
process tree holds what it held after the first 20 — open file descriptors,
``/dev/shm`` entries, child processes, asyncio tasks (``bench soak`` is the long run)."""

from __future__ import annotations

from pipeline_helpers import assert_nothing_held, make_spec

from omni_actors.bench.resources import snapshot
from omni_actors.bench.soak import drive
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.testing import eventually

SESSIONS = 8
TURNS_EACH = 3


async def test_two_hundred_conversations_hold_what_the_first_twenty_held() -> None:
    spec = make_spec(process=("thinker", "talker", "code2wav"))
    async with OmniPipeline(spec, max_sessions=SESSIONS) as omni:
        first = await drive(omni, SESSIONS, conversations=20)
        assert dict(first.outcomes) == {"completed": 20 * TURNS_EACH}
        await assert_nothing_held(omni)
        after_20 = snapshot()
        assert after_20.children == 3  # one worker per stage

        rest = await drive(omni, SESSIONS, conversations=180)
        assert dict(rest.outcomes) == {"completed": 180 * TURNS_EACH}
        await assert_nothing_held(omni)

        def back_to_after_20() -> None:
            now = snapshot().counts()
            assert now == after_20.counts(), f"after 200: {now}; after 20: {after_20.counts()}"

        await eventually(back_to_after_20, timeout=10)
