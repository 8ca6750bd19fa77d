"""Actors that tests run in worker processes (workers import them by module name)."""

from __future__ import annotations

import asyncio
import os

import msgspec
import torch

from omni_actors import Actor


class Payload(msgspec.Struct, tag=True, frozen=True):
    seq: int
    data: torch.Tensor


class Crash(msgspec.Struct, tag=True, frozen=True):
    reason: str


class Block(msgspec.Struct, tag=True, frozen=True):
    """Blocks the actor's receive for ``seconds``."""

    seconds: float


class Pid(msgspec.Struct, tag=True, frozen=True):
    pass


class Count(msgspec.Struct, tag=True, frozen=True):
    pass


class Echo(Actor[Payload | Crash | Block | Pid | Count]):
    """Replies with what it gets; counts messages; can crash or block on request."""

    replies = Payload | int

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.count = 0

    async def receive(self, message: Payload | Crash | Block | Pid | Count) -> Payload | int | None:
        self.count += 1
        match message:
            case Payload(seq=seq, data=data):
                return Payload(seq, data * self.scale if self.scale != 1.0 else data)
            case Crash(reason=reason):
                raise ValueError(reason)
            case Block(seconds=seconds):
                await asyncio.sleep(seconds)
            case Pid():
                return os.getpid()
            case Count():
                return self.count
        return None


class FailsToStart(Actor[Count]):
    async def on_start(self) -> None:
        raise RuntimeError("cannot start: no model weights")
