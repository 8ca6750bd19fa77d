"""A supervised three-stage pipeline: source -> transform -> sink.

The transform stage fails on one chunk (an injected fault standing in for a flaky
engine). Its supervisor, the ``Pipeline`` actor, restarts only that stage after a short
backoff. The chunks sent meanwhile wait in the stage's mailbox and flow on once it is
back, the stream finishes, and the tree shuts down in order: upstream stages first.

Run: python examples/supervised_pipeline.py
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass

from omni_actors import Actor, ActorRef, ActorSystem, Backoff, Props, SupervisorStrategy, run

log = logging.getLogger("example")

WORDS = ["the", "first", "audio", "packet", "leaves", "early"]
POISONED = 3  # the transform fails on this chunk: a deterministic injected fault


@dataclass(frozen=True)
class Chunk:
    seq: int
    text: str


@dataclass(frozen=True)
class EndOfStream:
    """Follows the last chunk through every stage."""


@dataclass(frozen=True)
class Emit:
    """Asks the source to stream its words."""


class Sink(Actor[Chunk | EndOfStream]):
    """Collects chunks and hands them over when the stream ends."""

    def __init__(self, finished: asyncio.Future[list[Chunk]]) -> None:
        self.finished = finished
        self.chunks: list[Chunk] = []

    async def receive(self, message: Chunk | EndOfStream) -> None:
        match message:
            case Chunk():
                self.chunks.append(message)
            case EndOfStream():
                self.finished.set_result(self.chunks)

    async def on_stop(self) -> None:
        log.info("sink stopped")


class Transform(Actor[Chunk | EndOfStream]):
    """Upper-cases text; raises on the poisoned chunk."""

    def __init__(self, sink: ActorRef[Chunk | EndOfStream]) -> None:
        self.sink = sink

    async def on_restart(self, cause: BaseException | None) -> None:
        # Runs on the fresh instance. The failed chunk is gone (as in Akka/OTP: the
        # message that crashed an actor is not redelivered); later ones are still queued.
        log.info("transform restarted after %r", cause)

    async def receive(self, message: Chunk | EndOfStream) -> None:
        if isinstance(message, Chunk):
            if message.seq == POISONED:
                raise ValueError(f"cannot decode chunk {message.seq}")
            message = Chunk(message.seq, message.text.upper())
        await self.sink.tell(message)

    async def on_stop(self) -> None:
        log.info("transform stopped")


class Source(Actor[Emit]):
    """Emits numbered chunks, then the end of the stream."""

    def __init__(self, downstream: ActorRef[Chunk | EndOfStream]) -> None:
        self.downstream = downstream

    async def receive(self, message: Emit) -> None:
        for seq, word in enumerate(WORDS):
            log.info("source -> chunk %d: %s", seq, word)
            # tell waits while the transform's mailbox is full: backpressure, not buffering.
            await self.downstream.tell(Chunk(seq, word))
        await self.downstream.tell(EndOfStream())

    async def on_stop(self) -> None:
        log.info("source stopped")


class Pipeline(Actor[Emit]):
    """The supervisor: starts the stages and restarts whichever one fails."""

    # Restart only the failed stage, at most 3 times in 5 s (beyond that the pipeline
    # gives up and escalates), waiting 50 ms, then 100 ms, ... between restarts.
    supervisor_strategy = SupervisorStrategy(
        "one_for_one", max_restarts=3, period=5.0, backoff=Backoff(min_s=0.05, max_s=1.0)
    )

    def __init__(self, finished: asyncio.Future[list[Chunk]]) -> None:
        self.finished = finished

    async def on_start(self) -> None:
        # Downstream first, so each stage is born with the ref of the next one; shutdown
        # goes in reverse start order, so the source stops before what it feeds.
        permanent = Props(restart="permanent")
        sink = await self.context.spawn(Sink, self.finished, name="sink", props=permanent)
        transform = await self.context.spawn(Transform, sink, name="transform", props=permanent)
        self.source = await self.context.spawn(Source, transform, name="source", props=permanent)

    async def receive(self, message: Emit) -> None:
        await self.source.tell(message)


async def main() -> None:
    finished: asyncio.Future[list[Chunk]] = asyncio.get_running_loop().create_future()
    async with ActorSystem("example") as system:
        pipeline = await system.spawn(Pipeline, finished, name="pipeline")
        await pipeline.tell(Emit())
        # A deadline, so that a pipeline that gave up cannot hang the program.
        chunks = await asyncio.wait_for(finished, timeout=5.0)
        print("sink got:", " ".join(chunk.text for chunk in chunks))
        log.info("shutting down")
    print("shut down cleanly")


if __name__ == "__main__":
    # INFO shows the runtime's own "restarting ..." line next to the stages' lines.
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(relativeCreated)4.0f ms  %(message)s"
    )
    run(main())
