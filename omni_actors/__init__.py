"""omni-actors: serve multi-stage omni speech models as supervised asyncio actors.

The kernel's public surface fits on one screen: subclass :class:`Actor`, start it in an
:class:`ActorSystem`, talk to it through its :class:`ActorRef`.
"""

from __future__ import annotations

from omni_actors._actor import Actor
from omni_actors._context import ActorContext
from omni_actors._mailbox import MailboxConfig
from omni_actors._ref import ActorRef
from omni_actors._system import ActorSystem, run
from omni_actors.clock import Clock, LoopClock
from omni_actors.errors import (
    ActorNameTakenError,
    ActorNotFoundError,
    ActorStoppedError,
    AskTimeoutError,
    MailboxFullError,
    MessageDroppedError,
    MessageTypeError,
    OmniError,
    ProtocolError,
    RestartIntensityExceededError,
    SendTimeoutError,
    StartTimeoutError,
    WorkerDiedError,
)
from omni_actors.signals import Terminated
from omni_actors.supervision import (
    Backoff,
    OverflowPolicy,
    RestartType,
    Strategy,
    SupervisorStrategy,
)

__all__ = [
    "Actor",
    "ActorContext",
    "ActorNameTakenError",
    "ActorNotFoundError",
    "ActorRef",
    "ActorStoppedError",
    "ActorSystem",
    "AskTimeoutError",
    "Backoff",
    "Clock",
    "LoopClock",
    "MailboxConfig",
    "MailboxFullError",
    "MessageDroppedError",
    "MessageTypeError",
    "OmniError",
    "OverflowPolicy",
    "ProtocolError",
    "RestartIntensityExceededError",
    "RestartType",
    "SendTimeoutError",
    "StartTimeoutError",
    "Strategy",
    "SupervisorStrategy",
    "Terminated",
    "WorkerDiedError",
    "run",
]

__version__ = "0.1.0.dev0"
