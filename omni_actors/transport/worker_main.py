"""Entry point of a worker process: ``python -m omni_actors.transport.worker_main``.

A worker hosts a small actor system and one node. It says ``Hello`` to its parent,
spawns the actors the parent asks for, reports when they exit, and exits itself on
``Shutdown`` — or as soon as its stdin closes, which is how it learns that the parent
died, so a worker is never orphaned.

Over TCP (``--parent-key``, a worker on another host) the worker first generates its
CURVE key pair, binds, and announces itself on stdout (:data:`ANNOUNCE`: version,
endpoint, public key) to whoever launched it; that reaches the parent, which admits the
key, links to the worker and sends the deployment's keys (``PeerKeys``). Only then does
the worker connect to the parent and say ``Hello``. Its secret key never leaves it.
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
from omni_actors.models.heap import freeze_heap
from omni_actors.protocols import wire
from omni_actors.transport.endpoints import CurveKeys
from omni_actors.transport.link import Link
from omni_actors.transport.node import Node
from omni_actors.transport.peer_auth import take_token
from omni_actors.transport.remote import error_to_wire

__all__ = ["ANNOUNCE", "WIRE_VERSION_ENV", "actor_spec", "load_actor", "main", "parse_args"]

log = logging.getLogger(__name__)

_START_BACKSTOP_S = 900.0
"""The worker's own bound on an actor's ``on_start``. The spawner's start deadline (the
process actor's ``Props.start_timeout``, a pipeline's ``deadlines.start_s``) is the one
that applies; it covers the launch too. This only ends a start nobody waits for."""

ANNOUNCE = "omni-actors-worker"
"""The first word of a TCP worker's line on stdout: ``omni-actors-worker VERSION
ENDPOINT PUBLIC_KEY``."""

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
    def __init__(self, system: ActorSystem, node: Node, parent: Link | None) -> None:
        self.system = system
        self.node = node
        self.parent = parent
        self.done = asyncio.Event()
        self.welcomed = asyncio.Event()  # over TCP: the parent sent the deployment's keys
        self._spawns: set[asyncio.Task[None]] = set()

    def on_control(self, message: wire.WireMessage) -> None:
        match message:
            case wire.SpawnActor():
                task = asyncio.get_running_loop().create_task(self._spawn(message))
                self._spawns.add(task)
                task.add_done_callback(self._spawns.discard)
            case wire.Shutdown():
                self.done.set()
            case wire.PeerKeys():
                self.welcomed.set()  # the node has taken the keys already
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
            self._to_parent(wire.ActorExited(node_id, request.name, *error_to_wire(exc)))
            return

        def exited(done: asyncio.Future[BaseException | None]) -> None:
            reason = done.result()
            error_type, text = ("", "") if reason is None else error_to_wire(reason)
            self._to_parent(wire.ActorExited(node_id, request.name, error_type, text))

        remoting.terminated(ref).add_done_callback(exited)
        # Started: what the worker holds now (torch, the engine, its weights' objects)
        # stays, so full collections need not walk it (see ``omni_actors.models.heap``).
        freeze_heap()
        self._to_parent(wire.ActorStarted(node_id, ref.path, request.capacity))

    def _to_parent(self, message: wire.WireMessage) -> None:
        # A spawn request comes from the parent, so the link to it is up by then.
        if self.parent is not None:
            self.parent.send(message)

    async def cancel_spawns(self) -> None:
        for task in list(self._spawns):
            task.cancel()
        await asyncio.gather(*self._spawns, return_exceptions=True)


def _announce(version: int, endpoint: str, public: bytes) -> None:
    """Tell the launcher where this worker listens and its key; then send whatever else
    writes to stdout to stderr, so the launcher need not drain the pipe."""
    sys.stdout.write(f"{ANNOUNCE} {version} {endpoint} {public.decode()}\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


async def _first(wanted: asyncio.Event, stop: asyncio.Event) -> bool:
    """Wait for ``wanted`` or ``stop`` (the parent left): whether ``wanted`` came."""
    waits = [asyncio.ensure_future(wanted.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return wanted.is_set()


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
    parent_key: bytes | None = None,
) -> None:
    """Run a worker until the parent says ``Shutdown`` or goes away.

    ``version`` is the wire version announced in ``Hello`` (only a test claims another);
    ``token`` is the deployment's (see ``peer_auth``); ``parent_key``, the parent's
    CURVE public key, makes this a TCP worker (see the module's doc).
    """
    async with ActorSystem(f"worker-{node_id}") as system:
        curve = None if parent_key is None else CurveKeys.generate()
        node = Node(system, node_id, endpoint, token=token, curve=curve)
        if parent_key is not None:
            node.peer_keys.add(0, parent_key)
        await node.start()
        try:
            worker = _Worker(system, node, None)
            node.control = worker.on_control
            stdin_task = asyncio.get_running_loop().create_task(_watch_stdin(worker.done))
            try:
                if curve is not None:
                    _announce(version, node.endpoint, curve.public)
                    if not await _first(worker.welcomed, worker.done):
                        return
                worker.parent = node.connect(0, parent_endpoint)
                worker.parent.send(wire.Hello(version, node_id, os.getpid(), node.endpoint))
                await worker.done.wait()
            finally:
                stdin_task.cancel()
                await asyncio.gather(stdin_task, return_exceptions=True)
                await worker.cancel_spawns()
                await system.shutdown()
        finally:
            await node.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line the parent built (``WorkerLaunch.argv``)."""
    parser = argparse.ArgumentParser(prog="omni_actors.transport.worker_main")
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--parent", required=True)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--parent-key", help="the parent's CURVE public key: a TCP worker")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line the parent built and serve."""
    ns = parse_args(argv)
    logging.basicConfig(
        level=ns.log_level, format=f"[worker {ns.node}] %(levelname)s %(name)s: %(message)s"
    )
    # Lets a test start a worker of "another release" through the real launch path.
    version = int(os.environ.get(WIRE_VERSION_ENV, wire.VERSION))
    token = take_token()  # first: nothing this worker starts may inherit it
    parent_key = ns.parent_key.encode() if ns.parent_key else None
    run(serve(ns.node, ns.endpoint, ns.parent, version=version, token=token, parent_key=parent_key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
