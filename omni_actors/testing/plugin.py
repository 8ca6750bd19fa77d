"""pytest plugin (registered through the ``pytest11`` entry point).

Fixtures:
    actor_testkit: an :class:`~omni_actors.testing.ActorTestKit` on real time.
    virtual_testkit: one driven by a virtual clock (``kit.virtual_clock.advance(s)``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator

from omni_actors.testing.kit import ActorTestKit

# The fixtures are async, so they need pytest-asyncio; without it the plugin adds nothing.
if importlib.util.find_spec("pytest_asyncio") is not None:
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def actor_testkit() -> AsyncIterator[ActorTestKit]:
        """An actor system for one test, shut down and leak-checked afterwards."""
        async with ActorTestKit() as kit:
            yield kit

    @pytest_asyncio.fixture
    async def virtual_testkit() -> AsyncIterator[ActorTestKit]:
        """Like ``actor_testkit`` but supervision time is a ``VirtualClock``."""
        async with ActorTestKit(virtual_time=True) as kit:
            yield kit
