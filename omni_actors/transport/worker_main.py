"""Entry point of a worker process: ``python -m omni_actors.transport.worker_main``.

A worker hosts a small actor system and one node. It says ``Hello`` to its parent,
spawns the actors the parent asks for, reports when they exit, and exits itself on
``Shutdown`` — or as soon as its stdin closes, which is how it learns that the parent
died, so a worker is never orphaned.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import os
import sys
import typing
from typing import Any

import msgspec

from omni_actors import Actor, ActorSystem, MailboxConfig, Props, remoting, run
from omni_actors.heap import freeze_heap
from omni_actors.protocols import wire
from omni_actors.transport.link import Link
from omni_actors.transport.node import Node
from omni_actors.transport.peer_auth import take_token
from omni_actors.transport.remote import error_to_wire

__all__ = ["WIRE_VERSION_ENV", "actor_spec", "load_actor", "main"]

log = logging.getLogger(__name__)

_START_BACKSTOP_S = 900.0
"""The worker's own bound on an actor's ``on_start``. The spawner's start deadline (the
process actor's ``Props.start_timeout``, a pipeline's ``deadlines.start_s``) is the one
that applies; it covers the launch too. This only ends a start nobody waits for."""

WIRE_VERSION_ENV = "OMNI_ACTORS_WORKER_WIRE_VERSION"
"""Environment variable overriding the wire version a worker announces (for tests)."""


def actor_spec(actor_cls: type[Actor[Any]]) -> str:
    """``"module:QualName"`` of an actor class a worker can import."""
    module = actor_cls.__module__
    if module == "__main__" or "<locals>" in actor_cls.__qualname__:
        raise ValueError(
            f"{actor_cls.__qualname__} cannot run in a worker process: define it at the top "
            "level of an importable module (not __main__ or inside a function)"
        )
    return f"{module}:{actor_cls.__qualname__}"


def load_actor(spec: str) -> type[Actor[Any]]:
    """Import the actor class named by :func:`actor_spec`."""
    module_name, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Actor)):
        raise TypeError(f"{spec} is not an Actor subclass")
    return obj


def _constructor_args(
    actor_cls: type[Actor[Any]], args: list[Any], kwargs: dict[str, Any]
) -> inspect.BoundArguments:
    """Bind wire-decoded arguments and convert them to the constructor's annotations."""
    bound = inspect.signature(actor_cls).bind(*args, **kwargs)
    hints = typing.get_type_hints(actor_cls.__init__)
    for name, value in bound.arguments.items():
        if name in hints:
            bound.arguments[name] = msgspec.convert(value, hints[name], strict=False)
    return bound


class _Worker:
    def __init__(self, system: ActorSystem, node: Node, parent: Link) -> None:
        self.system = system
        self.node = node
        self.parent = parent
        self.done = asyncio.Event()
        self._spawns: set[asyncio.Task[None]] = set()

    def on_control(self, message: wire.WireMessage) -> None:
        match message:
            case wire.SpawnActor():
                task = asyncio.get_running_loop().create_task(self._spawn(message))
                self._spawns.add(task)
                task.add_done_callback(self._spawns.discard)
            case wire.Shutdown():
                self.done.set()
            case _:
                log.warning("worker %d ignored %r", self.node.node_id, message)

    async def _spawn(self, request: wire.SpawnActor) -> None:
        node_id = self.node.node_id
        try:
            actor_cls = load_actor(request.actor)
            args = msgspec.msgpack.decode(request.args, type=list[Any])
            kwargs = msgspec.msgpack.decode(request.kwargs, type=dict[str, Any])
            bound = _constructor_args(actor_cls, args, kwargs)
            mailbox = MailboxConfig(
                request.capacity,
                typing.cast(Any, request.overflow),
                request.stash_capacity,
            )
            ref = await self.system.spawn(
                actor_cls,
                *bound.args,
                name=request.name,
                props=Props(mailbox=mailbox, start_timeout=_START_BACKSTOP_S),
                **bound.kwargs,
            )
        except Exception as exc:
            self.parent.send(wire.ActorExited(node_id, request.name, *error_to_wire(exc)))
            return

        def exited(done: asyncio.Future[BaseException | None]) -> None:
            reason = done.result()
            error_type, text = ("", "") if reason is None else error_to_wire(reason)
            self.parent.send(wire.ActorExited(node_id, request.name, error_type, text))

        remoting.terminated(ref).add_done_callback(exited)
        # Started: what the worker holds now (torch, the engine, its weights' objects)
        # stays, so full collections need not walk it (see ``omni_actors.heap``).
        freeze_heap()
        self.parent.send(wire.ActorStarted(node_id, ref.path, request.capacity))

    async def cancel_spawns(self) -> None:
        for task in list(self._spawns):
            task.cancel()
        await asyncio.gather(*self._spawns, return_exceptions=True)


async def _watch_stdin(done: asyncio.Event) -> None:
    """Set ``done`` when the parent closes our stdin (or dies, which closes it too)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    try:
        while await reader.read(4096):
            pass
    finally:
        transport.close()
        done.set()


async def serve(
    node_id: int,
    endpoint: str,
    parent_endpoint: str,
    *,
    version: int = wire.VERSION,
    token: bytes | None = None,
) -> None:
    """Run a worker until the parent says ``Shutdown`` or goes away.

    ``version`` is the wire version announced in ``Hello`` (only a test claims another);
    ``token`` is the deployment's (see ``peer_auth``).
    """
    async with ActorSystem(f"worker-{node_id}") as system:
        node = Node(system, node_id, endpoint, token=token)
        await node.start()
        try:
            parent = node.connect(0, parent_endpoint)
            worker = _Worker(system, node, parent)
            node.control = worker.on_control
            stdin_task = asyncio.get_running_loop().create_task(_watch_stdin(worker.done))
            parent.send(wire.Hello(version, node_id, os.getpid(), node.endpoint))
            try:
                await worker.done.wait()
            finally:
                stdin_task.cancel()
                await asyncio.gather(stdin_task, return_exceptions=True)
                await worker.cancel_spawns()
                await system.shutdown()
        finally:
            await node.close()


def main(argv: list[str] | None = None) -> int:
    """Parse the command line the parent built and serve."""
    parser = argparse.ArgumentParser(prog="omni_actors.transport.worker_main")
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--parent", required=True)
    parser.add_argument("--log-level", default="WARNING")
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=ns.log_level, format=f"[worker {ns.node}] %(levelname)s %(name)s: %(message)s"
    )
    # Lets a test start a worker of "another release" through the real launch path.
    version = int(os.environ.get(WIRE_VERSION_ENV, wire.VERSION))
    token = take_token()  # first: nothing this worker starts may inherit it
    run(serve(ns.node, ns.endpoint, ns.parent, version=version, token=token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
