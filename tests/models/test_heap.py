"""``freeze_heap``: what is garbage is collected first, what is alive is frozen, and
every stage worker freezes its heap once its actor started."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from transport.remote_actors import Echo, Frozen

from omni_actors import Props
from omni_actors.models.heap import freeze_heap
from omni_actors.testing import ActorTestKit


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the suite runs with the collector as it was


@pytest.mark.usefixtures("unfrozen")
def test_garbage_is_collected_before_the_rest_is_frozen() -> None:
    kept, dropped = _Node(), _Node()
    kept.other, dropped.other = kept, dropped  # two cycles: only the collector frees them
    alive, garbage = weakref.ref(kept), weakref.ref(dropped)
    del dropped

    frozen = freeze_heap()

    assert garbage() is None  # collected, not frozen forever
    assert alive() is kept
    # Frozen objects another thread frees leave the permanent generation (a thread an
    # earlier test's library left running lowered the count by 2 between two reads): the
    # count only goes down from what was frozen, and never to nothing until unfreeze.
    assert 0 < gc.get_freeze_count() <= frozen


async def test_a_stage_worker_freezes_its_heap_once_started() -> None:
    async with ActorTestKit(stop_timeout=2.0) as kit:
        ref = await kit.spawn(Echo, name="echo", props=Props(process=True))
        frozen = await ref.ask(Frozen(), timeout=30)

    assert isinstance(frozen, int)
    assert frozen > 10_000  # torch and the runtime, at least
