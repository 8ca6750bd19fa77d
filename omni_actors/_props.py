"""``Props``: how to spawn an actor, as one value (after Akka's ``Props``).

Spawn options used to be keywords repeated in every ``spawn`` signature; as one frozen
object they are validated once, can be built ahead (a pipeline builds one per stage)
and passed through unchanged.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, get_args

from omni_actors._mailbox import MailboxConfig
from omni_actors.supervision import RestartType, SupervisorStrategy

__all__ = ["PROCESS", "Props", "check_spawn_kwargs"]

PROCESS = "process"
"""The placement kind of ``Props(process=True)``: the actor runs in a worker process."""

_RESTART_TYPES: tuple[str, ...] = get_args(RestartType)


@dataclass(frozen=True, slots=True, kw_only=True)
class Props:
    """Spawn options of one actor: ``spawn(Cls, *args, props=Props(...), **kwargs)``.

    Attributes:
        mailbox: overrides the class's ``mailbox`` settings.
        strategy: how this actor supervises its own children (default: the class's
            ``supervisor_strategy``).
        restart: ``permanent``, ``transient`` or ``temporary`` (default: a failure stops
            the actor, as in Akka Typed).
        process: run the actor in its own worker process. Its class must live in an
            importable module, its constructor arguments and messages must be
            msgspec-encodable (messages: ``msgspec.Struct``s, tensors allowed), and the
            returned ref behaves exactly like a local one; if the process dies, the
            actor fails and its supervisor decides (a restart starts a fresh worker;
            tells the dead worker had not processed are lost, asks fail). Overflow
            ``drop_oldest`` cannot recall sent messages, so it waits like
            ``backpressure``. Tensors sent to it are copied once when sent: the sender
            may change them as soon as ``tell`` returns.
        start_timeout: deadline in seconds for ``on_start`` (for a process actor: for
            the worker to start and the actor's ``on_start`` in it).
        host: with ``process``, where the worker runs: a ``WorkerHost`` of
            ``omni_actors.transport.worker_hosts`` (a cluster's, from
            ``omni_actors.cluster``); None: a child process on this machine.
    """

    mailbox: MailboxConfig | None = None
    strategy: SupervisorStrategy | None = None
    restart: RestartType = "temporary"
    process: bool = False
    start_timeout: float = 30.0
    host: Any = None

    def __post_init__(self) -> None:
        if self.host is not None and not self.process:
            raise ValueError("Props.host says where a worker process runs: it needs process=True")
        if self.mailbox is not None and not isinstance(self.mailbox, MailboxConfig):
            raise TypeError(f"Props.mailbox must be a MailboxConfig, got {self.mailbox!r}")
        if self.strategy is not None and not isinstance(self.strategy, SupervisorStrategy):
            raise TypeError(f"Props.strategy must be a SupervisorStrategy, got {self.strategy!r}")
        if self.restart not in _RESTART_TYPES:
            raise ValueError(
                f"Props.restart must be one of {', '.join(_RESTART_TYPES)}, got {self.restart!r}"
            )
        if not isinstance(self.process, bool):
            raise TypeError(f"Props.process must be True or False, got {self.process!r}")
        if not (isinstance(self.start_timeout, int | float) and self.start_timeout > 0) or (
            math.isnan(self.start_timeout)
        ):
            raise ValueError(
                f"Props.start_timeout must be a number of seconds > 0, got {self.start_timeout!r}"
            )

    @property
    def placement(self) -> str | None:
        """The placement kind that hosts the actor; ``None``: in this process."""
        return PROCESS if self.process else None


_FIELDS = frozenset(f.name for f in fields(Props))


def check_spawn_kwargs(actor_cls: type, kwargs: Iterable[str]) -> None:
    """Refuse a spawn option passed as a keyword that the constructor would not take.

    Spawn options used to be keywords of ``spawn``; now a leftover ``restart=...``
    would reach the actor's constructor and fail far from the cause.
    """
    stray = _FIELDS.intersection(kwargs)
    if not stray:
        return
    try:
        params = inspect.signature(actor_cls).parameters.values()
    except (TypeError, ValueError):
        return  # no signature to check against: let the constructor decide
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    taken: set[Any] = {p.name for p in params}
    stray -= taken
    if stray:
        options = ", ".join(f"{name}=..." for name in sorted(stray))
        raise TypeError(
            f"spawn({actor_cls.__name__}, {options}): spawn options go in "
            f"props=Props({options}); {actor_cls.__name__}'s constructor takes no such argument"
        )
