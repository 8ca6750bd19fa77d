"""The runtime's own control traffic: system-lane messages and supervisor work."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_actors._cell import ActorCell
    from omni_actors._mailbox import Envelope


@dataclass(slots=True)
class Stop:
    """Terminate for good (from the parent, the system, or a ``stop`` call)."""

    reason: BaseException | None = None


@dataclass(slots=True)
class Fail:
    """Fail now, as if ``receive`` had raised ``error`` (None: as if it stopped itself).

    Sent by whatever watches a resource the actor depends on, e.g. its worker process.
    """

    error: BaseException | None


@dataclass(slots=True)
class Control:
    """A user message whose type is a ``ControlMessage``, riding the system lane.

    It is wrapped rather than queued bare so that the cell tells it apart from the
    runtime's own messages, yet handles it (and answers its ask) like a user message.
    """

    envelope: Envelope


@dataclass(slots=True)
class Suspend:
    """Stop taking user messages (stash them) until a ``Restart`` arrives."""


@dataclass(slots=True)
class Teardown:
    """Discard the current instance (children stopped, ``on_stop``) ahead of a restart."""

    done: asyncio.Future[None]


@dataclass(slots=True)
class Restart:
    """Build a fresh instance and resume, replaying the stash first."""

    cause: BaseException | None
    done: asyncio.Future[None]


@dataclass(slots=True)
class ChildExited:
    """To a parent's supervisor: a child exited and its restart type wants it back; it
    failed with ``error``, or (``error`` None) a permanent child stopped itself.

    OTP's exit signal to a supervisor (``{'EXIT', Child, Reason}``), whose reason may be
    normal. Not the public ``omni_actors.ChildFailed`` signal, which tells a parent of
    failures only, whatever its supervisor decides.
    """

    child: ActorCell
    error: BaseException | None


@dataclass(slots=True)
class RestartGroup:
    """To a supervisor, from its own backoff timer: restart these children now."""

    children: list[ActorCell]
    cause: BaseException | None
