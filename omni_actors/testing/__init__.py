"""Test harness for actors: test kit, probes, virtual time and fault injection.

Installed as a pytest plugin: the ``actor_testkit`` and ``virtual_testkit`` fixtures are
available in any project that installs omni-actors.
"""

from __future__ import annotations

from omni_actors.testing.clock import VirtualClock
from omni_actors.testing.faults import InjectedFault, crash_after
from omni_actors.testing.kit import ActorTestKit
from omni_actors.testing.probe import TestProbe

__all__ = ["ActorTestKit", "InjectedFault", "TestProbe", "VirtualClock", "crash_after"]
