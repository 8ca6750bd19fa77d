"""Two nodes of one process, linked over IPC in a private runtime directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from omni_actors import ActorSystem
from omni_actors.testing import ActorTestKit
from omni_actors.transport.endpoints import RuntimeDir
from omni_actors.transport.node import Node


@asynccontextmanager
async def node_pair(token: bytes | None = None) -> AsyncIterator[tuple[ActorTestKit, Node, Node]]:
    """Node 1 (the test kit's system: it receives) and node 2 (a system of its own: it
    sends), both started; closed, and their directory removed, afterwards."""
    rundir = RuntimeDir()
    try:
        async with ActorTestKit() as kit, ActorSystem() as other:
            receiver = Node(kit.system, 1, rundir.endpoint(1), token=token)
            sender = Node(other, 2, rundir.endpoint(2), token=token)
            await receiver.start()
            await sender.start()
            try:
                yield kit, receiver, sender
            finally:
                await sender.close()
                await receiver.close()
    finally:
        rundir.cleanup()
