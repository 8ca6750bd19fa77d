"""omni-actors: serve multi-stage omni speech models as supervised asyncio actors.

The kernel's public surface fits on one screen: subclass :class:`Actor`, start it in an
:class:`ActorSystem`, talk to it through its :class:`ActorRef`. Serving a pipeline is
:class:`OmniPipeline` (imported on first use, so the kernel alone does not load torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omni_actors._actor import Actor
from omni_actors._context import ActorContext
from omni_actors._mailbox import MailboxConfig
from omni_actors._props import PROCESS, Props
from omni_actors._ref import ActorRef
from omni_actors._state import CellState
from omni_actors._system import ActorSystem, run
from omni_actors._task_scope import TaskScope
from omni_actors.clock import Clock, LoopClock
from omni_actors.errors import (
    ActorNameTakenError,
    ActorNotFoundError,
    ActorStoppedError,
    AskTimeoutError,
    InvalidRequestError,
    MailboxFullError,
    MessageDroppedError,
    MessageTypeError,
    OmniError,
    ProtocolError,
    ProtocolVersionError,
    RestartIntensityExceededError,
    SendTimeoutError,
    StartTimeoutError,
    WorkerDiedError,
)
from omni_actors.protocols.message import ControlMessage, Request
from omni_actors.remoting import Placement, register_placement
from omni_actors.signals import ChildFailed, Terminated
from omni_actors.supervision import (
    Backoff,
    OverflowPolicy,
    RestartType,
    Strategy,
    SupervisorStrategy,
)

if TYPE_CHECKING:
    from omni_actors.pipeline.omni_pipeline import OmniPipeline
    from omni_actors.pipeline.response import Response
    from omni_actors.pipeline.session import Session
    from omni_actors.pipeline.session_input import SessionClosedError
    from omni_actors.protocols.events import (
        Aborted,
        AudioDelta,
        Done,
        Event,
        ResponseDone,
        SessionError,
        SessionMetrics,
        TextDelta,
        TranscriptDelta,
        TranscriptDone,
        TranscriptFailed,
    )

_LAZY = {
    "OmniPipeline": "omni_actors.pipeline.omni_pipeline",
    "Session": "omni_actors.pipeline.session",
    "Response": "omni_actors.pipeline.response",
    "SessionClosedError": "omni_actors.pipeline.session",
    "Aborted": "omni_actors.protocols.events",
    "AudioDelta": "omni_actors.protocols.events",
    "Done": "omni_actors.protocols.events",
    "Event": "omni_actors.protocols.events",
    "ResponseDone": "omni_actors.protocols.events",
    "SessionError": "omni_actors.protocols.events",
    "SessionMetrics": "omni_actors.protocols.events",
    "TextDelta": "omni_actors.protocols.events",
    "TranscriptDelta": "omni_actors.protocols.events",
    "TranscriptDone": "omni_actors.protocols.events",
    "TranscriptFailed": "omni_actors.protocols.events",
}


def _process_placement(system: ActorSystem) -> Placement:
    # The one place that wires the transport into the kernel, on the first process
    # actor of a system: programs without one never import ZeroMQ (or torch).
    from omni_actors.transport.process_placement import ProcessPlacement

    return ProcessPlacement(system)


register_placement(PROCESS, _process_placement)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'omni_actors' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Aborted",
    "AudioDelta",
    "Done",
    "Event",
    "InvalidRequestError",
    "OmniPipeline",
    "Response",
    "ResponseDone",
    "Session",
    "SessionClosedError",
    "SessionError",
    "SessionMetrics",
    "TextDelta",
    "TranscriptDelta",
    "TranscriptDone",
    "TranscriptFailed",
    "Actor",
    "ActorContext",
    "ActorNameTakenError",
    "ActorNotFoundError",
    "ActorRef",
    "ActorStoppedError",
    "ActorSystem",
    "AskTimeoutError",
    "Backoff",
    "CellState",
    "ChildFailed",
    "Clock",
    "ControlMessage",
    "LoopClock",
    "MailboxConfig",
    "MailboxFullError",
    "MessageDroppedError",
    "MessageTypeError",
    "OmniError",
    "OverflowPolicy",
    "ProtocolError",
    "ProtocolVersionError",
    "Props",
    "Request",
    "RestartIntensityExceededError",
    "RestartType",
    "SendTimeoutError",
    "StartTimeoutError",
    "Strategy",
    "SupervisorStrategy",
    "TaskScope",
    "Terminated",
    "WorkerDiedError",
    "run",
]

__version__ = "0.1.0.dev0"
