"""Actors that tests run in worker processes (workers import them by module name)."""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

import msgspec
import torch

from omni_actors import Actor, ActorRef, ControlMessage


class Payload(msgspec.Struct, tag=True, frozen=True):
    seq: int
    data: torch.Tensor


class Relay(Actor[Payload]):
    """Decodes ``Payload`` off the wire and forwards it to a probe (which keeps its
    tensor, and so its slab slot)."""

    def __init__(self, probe: ActorRef[object]) -> None:
        self.probe = probe

    async def receive(self, message: Payload) -> None:
        await self.probe.tell(message)


class Crash(msgspec.Struct, tag=True, frozen=True):
    reason: str


class Block(msgspec.Struct, tag=True, frozen=True):
    """Blocks the actor's receive for ``seconds``."""

    seconds: float


class Pid(msgspec.Struct, tag=True, frozen=True):
    pass


class Count(msgspec.Struct, tag=True, frozen=True):
    pass


class Frozen(msgspec.Struct, tag=True, frozen=True):
    """Asks how many objects the worker froze out of the collector's reach."""


class Echo(Actor[Payload | Crash | Block | Pid | Count | Frozen]):
    """Replies with what it gets; counts messages; can crash or block on request."""

    replies = Payload | int

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.count = 0

    async def receive(
        self, message: Payload | Crash | Block | Pid | Count | Frozen
    ) -> Payload | int | None:
        self.count += 1
        match message:
            case Payload(seq=seq, data=data):
                return Payload(seq, data * self.scale if self.scale != 1.0 else data)
            case Crash(reason=reason):
                raise ValueError(reason)
            case Block(seconds=seconds):
                await asyncio.sleep(seconds)  # a busy actor: the behaviour under test
            case Pid():
                return os.getpid()
            case Count():
                return self.count
            case Frozen():
                return gc.get_freeze_count()
        return None


class FailsToStart(Actor[Count]):
    async def on_start(self) -> None:
        raise RuntimeError("cannot start: no model weights")


class Notify(msgspec.Struct, tag=True, frozen=True):
    """Ask an actor to tell ``to`` a greeting (``to`` may live in any process)."""

    to: ActorRef[Any]


class Route(msgspec.Struct, tag=True, frozen=True):
    """Forward ``payload`` to ``to`` directly, without passing through the parent."""

    to: ActorRef[Any]
    payload: Payload


class Forwarder(Actor[Route]):
    async def receive(self, message: Route) -> None:
        await message.to.tell(message.payload, timeout=10)


class Greeter(Actor[Notify | Pid]):
    async def receive(self, message: Notify | Pid) -> int | None:
        match message:
            case Notify(to=to):
                await to.tell(f"hello from {os.getpid()}", timeout=10)
            case Pid():
                return os.getpid()
        return None


class Note(msgspec.Struct, tag=True, frozen=True):
    n: int


class Urgent(msgspec.Struct, ControlMessage, tag=True, frozen=True):
    """A control message: overtakes queued messages and needs no credit."""

    n: int


class History(msgspec.Struct, tag=True, frozen=True):
    pass


class Recorder(Actor[Block | Note | Urgent | History]):
    """Records the order it handles notes (``n``) and urgent messages (``-n``) in."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def receive(self, message: Block | Note | Urgent | History) -> Any:
        match message:
            case Block(seconds=seconds):
                await asyncio.sleep(seconds)  # a busy actor: the behaviour under test
            case Note(n=n):
                self.seen.append(n)
            case Urgent(n=n):
                self.seen.append(-n)
                return n * 10
            case History():
                return self.seen
        return None


class Smallest(Actor[Payload | Count]):
    """Records the smallest value of every payload it is told; ``Count`` returns them."""

    replies = list[float]

    def __init__(self) -> None:
        self.seen: list[float] = []

    async def receive(self, message: Payload | Count) -> list[float] | None:
        match message:
            case Payload(data=data):
                self.seen.append(float(data.min()))
            case Count():
                return self.seen
        return None


class EnvVar(msgspec.Struct, tag=True, frozen=True):
    """Asks for the worker's environment variable ``name`` ("" if unset)."""

    name: str


class Environ(Actor[EnvVar]):
    """Answers what its worker's environment says (as a stage's engine would read it)."""

    replies = str

    async def receive(self, message: EnvVar) -> str:
        return os.environ.get(message.name, "")
