"""Test harness for actors: test kit, probes, waiting on conditions, virtual time and
fault injection.

Installed as a pytest plugin: the ``actor_testkit`` and ``virtual_testkit`` fixtures are
available in any project that installs omni-actors. Tests wait with :func:`eventually`
(or ``ActorTestKit.eventually``), never with a sleep; :mod:`.inspection` is what a test
may read of a running actor.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omni_actors.testing.clock import VirtualClock
from omni_actors.testing.faults import InjectedFault, crash_after, kill_worker, worker_pid
from omni_actors.testing.kit import ActorTestKit
from omni_actors.testing.probe import TestProbe
from omni_actors.testing.waiting import consistently, eventually

if TYPE_CHECKING:
    from omni_actors.testing.chunk_faults import ChunkFaults, FaultyEdge, PipelineFaults
    from omni_actors.testing.one_engine import engine_pipeline

# Pipelines load torch; the plain actor harness (and the pytest plugin) must not.
_LAZY = {
    "ChunkFaults": "chunk_faults",
    "FaultyEdge": "chunk_faults",
    "PipelineFaults": "chunk_faults",
    "engine_pipeline": "one_engine",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'omni_actors.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"omni_actors.testing.{_LAZY[name]}"), name)


__all__ = [
    "ActorTestKit",
    "ChunkFaults",
    "FaultyEdge",
    "InjectedFault",
    "PipelineFaults",
    "TestProbe",
    "VirtualClock",
    "consistently",
    "crash_after",
    "engine_pipeline",
    "eventually",
    "kill_worker",
    "worker_pid",
]
