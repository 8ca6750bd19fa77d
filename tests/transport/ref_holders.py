"""Actors for tests of refs that outlive their actor's worker (workers import them by
module name)."""

from __future__ import annotations

import os
from typing import Any

import msgspec
from remote_actors import History, Note, Pid

from omni_actors import Actor, ActorRef, OmniError


class Keep(msgspec.Struct, tag=True, frozen=True):
    """Keep ``to`` (a ref from another process) for later sends."""

    to: ActorRef[Any]


class SendNote(msgspec.Struct, tag=True, frozen=True):
    """Tell the kept ref ``Note(n)``."""

    n: int


class AskPid(msgspec.Struct, tag=True, frozen=True):
    """Ask the kept ref for its process id."""


class Holder(Actor[Keep | SendNote | AskPid]):
    """Sends through the one ref it was given, however long ago.

    Replies with what the send gave: the pid asked for, ``"sent"``, or the name of the
    error it raised (so a failed send does not stop the holder).
    """

    replies = int | str

    def __init__(self) -> None:
        self.kept: ActorRef[Any] | None = None

    async def receive(self, message: Keep | SendNote | AskPid) -> int | str:
        if isinstance(message, Keep):
            self.kept = message.to
            return "kept"
        assert self.kept is not None
        try:
            if isinstance(message, SendNote):
                await self.kept.tell(Note(message.n), timeout=60)
                return "sent"
            pid: int = await self.kept.ask(Pid(), timeout=60)
            return pid
        except OmniError as exc:
            return type(exc).__name__


class Tally(Actor[Note | Pid | History]):
    """Records the notes this instance was told; says which process it runs in."""

    replies = int | list[int]

    def __init__(self) -> None:
        self.notes: list[int] = []

    async def receive(self, message: Note | Pid | History) -> int | list[int] | None:
        match message:
            case Note(n=n):
                self.notes.append(n)
            case Pid():
                return os.getpid()
            case History():
                return self.notes
        return None
