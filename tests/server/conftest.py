"""Servers for the server tests: real sockets on 127.0.0.1, a fast scripted pipeline."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings

FAST = ServerSettings(preset="scripted-omni", port=0)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[RunningServer]:
    async with run_server(FAST) as running:
        yield running
