"""A supervised three-stage pipeline: source -> transform -> sink.

The transform stage fails on one chunk (a stand-in for a flaky engine). Its supervisor
restarts it with backoff; the failed chunk is reported to the sender, later chunks keep
flowing, and the whole tree shuts down in order at the end.

Run: python examples/supervised_pipeline.py
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omni_actors import Actor, ActorRef, ActorSystem, Backoff, SupervisorStrategy, run


@dataclass(frozen=True)
class Chunk:
    seq: int
    text: str


@dataclass(frozen=True)
class Collected:
    """Ask the sink what it has."""


class Sink(Actor[Chunk | Collected]):
    def __init__(self) -> None:
        self.chunks: list[Chunk] = []

    async def receive(self, message: Chunk | Collected) -> list[Chunk] | None:
        match message:
            case Chunk():
                self.chunks.append(message)
            case Collected():
                return list(self.chunks)
        return None


class Transform(Actor[Chunk]):
    """Upper-cases text; chunk 3 is poisoned and makes the stage fail."""

    def __init__(self, sink: ActorRef[Chunk | Collected]) -> None:
        self.sink = sink

    async def on_restart(self, cause: BaseException | None) -> None:
        print(f"  transform restarted after: {cause!r}")

    async def receive(self, message: Chunk) -> None:
        if message.seq == 3:
            raise RuntimeError(f"cannot decode chunk {message.seq}")
        await self.sink.tell(Chunk(message.seq, message.text.upper()))


class Pipeline(Actor[Chunk | Collected]):
    """The supervisor: owns both stages and routes input through them."""

    # Restart only the stage that failed, at most 5 times in 10 s, after a short backoff.
    supervisor_strategy = SupervisorStrategy(
        "one_for_one", max_restarts=5, period=10.0, backoff=Backoff(min_s=0.05, max_s=1.0)
    )

    async def on_start(self) -> None:
        self.sink = await self.context.spawn(Sink, name="sink", restart="permanent")
        self.transform = await self.context.spawn(
            Transform, self.sink, name="transform", restart="permanent"
        )

    async def receive(self, message: Chunk | Collected) -> list[Chunk] | None:
        match message:
            case Chunk():
                try:
                    # ask, not tell: the source learns which chunk failed.
                    await self.transform.ask(message, timeout=2.0)
                except RuntimeError as exc:
                    print(f"  chunk {message.seq} failed: {exc}")
                return None
            case Collected():
                result: list[Chunk] = await self.sink.ask(message, timeout=2.0)
                return result


async def main() -> None:
    async with ActorSystem("example") as system:
        pipeline = await system.spawn(Pipeline, name="pipeline", restart="permanent")
        for seq, word in enumerate(["the", "first", "audio", "packet", "leaves", "early"]):
            print(f"source -> chunk {seq}: {word}")
            await pipeline.tell(Chunk(seq, word))
        chunks = await pipeline.ask(Collected(), timeout=5.0)
        print("sink got:", " ".join(chunk.text for chunk in chunks))
    print("shut down cleanly")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run(main())
