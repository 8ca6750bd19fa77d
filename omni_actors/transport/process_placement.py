"""Worker processes of one actor system, and the actor that hosts each of them.

:class:`ProcessPlacement` is the kernel's ``"process"`` placement
(``Props(process=True)``): the actor gets an ordinary local cell whose instance is a
:class:`ProcessHost` and whose mailbox is a
:class:`~omni_actors.transport.remote.RemoteMailbox`: refs, ``watch`` and supervision
work exactly as for a local actor, while messages go straight to the worker. The host
launches the worker (``spawn`` start method: a fresh interpreter, nothing inherited)
on its ``WorkerHost`` (``Props.host``: this machine unless told otherwise), waits on the
process itself — so a death is noticed the moment it happens, with no polling — and
turns that death into a failure its supervisor handles.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from omni_actors import Actor, remoting
from omni_actors.errors import ActorStoppedError, ProtocolVersionError, WorkerDiedError
from omni_actors.protocols import wire
from omni_actors.remoting import Hosting, PlacedActor
from omni_actors.transport import peer_auth
from omni_actors.transport.endpoints import CurveKeys, RuntimeDir
from omni_actors.transport.link import Link
from omni_actors.transport.node import Node
from omni_actors.transport.remote import RemoteMailbox, error_from_wire
from omni_actors.transport.worker_hosts import (
    IPC,
    LOCAL,
    TcpNetwork,
    WorkerHandle,
    WorkerHost,
    WorkerLaunch,
)
from omni_actors.transport.worker_main import ANNOUNCE, actor_spec

__all__ = ["ProcessHost", "ProcessPlacement", "Workers"]

if TYPE_CHECKING:
    from omni_actors import ActorRef, ActorSystem

log = logging.getLogger(__name__)

_BACKOFF_ALLOWANCE_S = 60.0
"""Slack for a supervisor's backoff before it restarts a process actor (``Backoff``'s
default caps it at 5 s), in how long refs to the actor wait for it (``restart_wait``)."""


class ProcessPlacement:
    """The ``"process"`` placement: each actor in a fresh worker process of its own.

    One per actor system, built by the kernel on its first process actor: it binds the
    parent's node then, and ``close`` (at system shutdown) stops every worker.
    """

    def __init__(self, system: ActorSystem) -> None:
        self.system = system
        self._networks: dict[TcpNetwork | None, Workers] = {}

    @property
    def workers(self) -> Workers:
        """The workers on this host's IPC network."""
        return self.workers_of(IPC)

    def workers_of(self, network: TcpNetwork | None) -> Workers:
        """The workers on ``network`` (created on first use: a node of its own)."""
        workers = self._networks.get(network)
        if workers is None:
            workers = self._networks[network] = Workers(self.system, network=network)
        return workers

    async def place(self, actor: PlacedActor) -> Hosting:
        """A forwarding mailbox and a :class:`ProcessHost` that runs ``actor`` in a worker
        on ``actor.host`` (a ``WorkerHost``; None: this machine, over IPC)."""
        actor_spec(actor.actor_cls)  # fail fast if a worker could not import the class
        host: WorkerHost = LOCAL if actor.host is None else actor.host
        workers = self.workers_of(host.network)
        await workers.start()
        mailbox = RemoteMailbox(actor.path, actor.mailbox, actor.actor_cls.replies)
        return Hosting(
            mailbox,
            lambda: ProcessHost(workers, host, actor.actor_cls, actor.args, actor.kwargs, mailbox),
        )

    def counts(self) -> dict[str, int]:
        """This process's nodes: frames they refused, and messages lost with dead workers."""
        nodes = [workers.node for workers in self._networks.values()]
        return {
            "refused_frames": sum(node.refusals.total for node in nodes),
            "lost_messages": sum(node.lost for node in nodes),
        }

    async def close(self) -> None:
        """Stop every worker and release the nodes and runtime directory."""
        for workers in self._networks.values():
            await workers.close()


class WorkerProcess:
    """One running worker: its process, node id and the link to it."""

    def __init__(self, node_id: int, proc: WorkerHandle, link: Link) -> None:
        self.node_id = node_id
        self.proc = proc
        self.link = link


class Workers:
    """Launches and tracks the worker processes of one :class:`ActorSystem` on one
    network (``network``: :data:`IPC` on this host, or a :class:`TcpNetwork`).

    Owns the parent's node (id 0) and the private runtime directory; ``close`` stops
    every worker and removes both.
    """

    def __init__(
        self,
        system: ActorSystem,
        *,
        network: TcpNetwork | None = IPC,
        start_timeout: float = 60.0,
        actor_timeout: float = 900.0,
    ) -> None:
        self.system = system
        self.network = network
        self.start_timeout = start_timeout
        # An actor's on_start may load a model for minutes (vLLM): its spawner's own start
        # deadline (a pipeline's deadlines.start_s) bounds it; this only backs it up.
        self.actor_timeout = actor_timeout
        # How long other workers' refs to a process actor whose worker died wait for it
        # to come back (see ``remote_refs``): a restart launches a worker and starts the
        # actor, each under its deadline above, after the supervisor's backoff. The
        # parent's ``ActorMoved`` or ``ActorGone`` normally ends the wait long before.
        self.restart_wait = start_timeout + actor_timeout + _BACKOFF_ALLOWANCE_S
        self.rundir = RuntimeDir()
        self.token: bytes | None = None
        self.curve: CurveKeys | None = None
        if network is IPC:
            # Only the workers launched here get it: nothing else can connect to a node.
            self.token = peer_auth.new_token()
            self.node = Node(system, 0, self.rundir.endpoint(0), token=self.token)
        else:
            # Each node its own key pair; a node admits the keys the parent gives it.
            self.curve = CurveKeys.generate()
            self.node = Node(system, 0, f"tcp://{network.bind}:*", curve=self.curve)
        self.node.control = self._on_control
        self._started_node = False
        self._ids = itertools.count(1)
        self._hello: dict[int, asyncio.Future[wire.Hello]] = {}
        self._started: dict[int, asyncio.Future[wire.ActorStarted]] = {}
        self._hosts: dict[int, ProcessHost] = {}
        self._procs: dict[int, WorkerHandle] = {}
        self._actors: dict[int, str] = {}  # node id → the path of the actor it hosts
        self._down: set[int] = set()  # workers whose death the others have been told
        self._stopping: set[int] = set()  # workers asked to exit (see ``NodeDown.stopped``)

    async def start(self) -> None:
        """Bind the parent's node (once)."""
        if not self._started_node:
            self._started_node = True
            await self.node.start()

    async def launch(self, host: WorkerHost = LOCAL) -> WorkerProcess:
        """Start a worker process on ``host`` and wait for its ``Hello``."""
        node_id = next(self._ids)
        hello: asyncio.Future[wire.Hello] = asyncio.get_running_loop().create_future()
        self._hello[node_id] = hello
        level = logging.getLevelName(logging.getLogger("omni_actors").getEffectiveLevel())
        if self.curve is None:
            assert self.token is not None
            env = {peer_auth.TOKEN_ENV: self.token.decode()}
            launch = WorkerLaunch(
                node_id, self.node.endpoint, self.rundir.endpoint(node_id), None, level, env
            )
        else:
            launch = WorkerLaunch(node_id, self.node.endpoint, None, self.curve.public, level)
        proc: WorkerHandle | None = None
        try:
            async with asyncio.timeout(self.start_timeout):
                proc = await host.start(launch)
                self._procs[node_id] = proc
                if self.curve is not None:
                    await self._welcome(node_id, proc)
                exited = asyncio.ensure_future(proc.wait())
                either: list[asyncio.Future[Any]] = [hello, exited]
                try:
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    exited.cancel()
            if not hello.done():
                raise WorkerDiedError("a new worker", proc.pid, proc.returncode)
            greeting = hello.result()
            if greeting.version != wire.VERSION:
                raise ProtocolVersionError(f"worker {proc.pid}", wire.VERSION, greeting.version)
            link = self.node.connect(node_id, greeting.endpoint)
        except BaseException:
            if proc is not None:
                await self._reap(node_id, proc)
            raise
        finally:
            self._hello.pop(node_id, None)
        return WorkerProcess(node_id, proc, link)

    async def _welcome(self, node_id: int, proc: WorkerHandle) -> None:
        """A TCP worker announced its endpoint and key: admit it, give it every node's
        key, and give the others its key (before any ref to its actor exists)."""
        line = await proc.announcement()
        words = line.split()
        if len(words) != 4 or words[0] != ANNOUNCE or not words[1].isdigit():
            raise WorkerDiedError(f"a new worker (it announced {line[:200]!r})", proc.pid, None)
        version = int(words[1])
        if version != wire.VERSION:
            raise ProtocolVersionError(f"worker {proc.pid}", wire.VERSION, version)
        endpoint, public = words[2], words[3].encode()
        keys = {peer: key.decode() for peer, key in self.node.peer_keys.items()}
        self.node.peer_keys.add(node_id, public)
        self.node.broadcast(wire.PeerKeys({node_id: public.decode()}), exclude=node_id)
        self.node.connect(node_id, endpoint).send(wire.PeerKeys(keys))

    async def spawn_actor(
        self,
        worker: WorkerProcess,
        actor_cls: type[Actor[Any]],
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        mailbox: RemoteMailbox,
    ) -> wire.ActorStarted:
        """Ask ``worker`` to start the actor; raise what its ``on_start`` raised."""
        started: asyncio.Future[wire.ActorStarted] = asyncio.get_running_loop().create_future()
        self._started[worker.node_id] = started
        config = mailbox.config
        try:
            request = wire.SpawnActor(
                actor=actor_spec(actor_cls),
                name=name,
                args=msgspec.Raw(msgspec.msgpack.encode(list(args))),
                kwargs=msgspec.Raw(msgspec.msgpack.encode(kwargs)),
                capacity=config.capacity,
                overflow=config.overflow,
                stash_capacity=config.stash_capacity,
            )
            worker.link.send(request)
            async with asyncio.timeout(self.actor_timeout):
                reply = await started
            self._actors[worker.node_id] = reply.name
            return reply
        finally:
            self._started.pop(worker.node_id, None)

    def announce_start(
        self, ref: ActorRef[Any], mailbox: RemoteMailbox, before: tuple[int, str]
    ) -> None:
        """``mailbox``'s actor was started: if it ran on node ``before[0]`` until now
        (a restart), tell the other workers where it is now, so their refs follow it."""
        node_id, path = before
        if node_id < 0:
            # Its first start: its stop for good, whenever it comes, is announced too.
            terminated = remoting.terminated(ref)
            terminated.add_done_callback(functools.partial(self._announce_gone, mailbox))
            return
        here = wire.RefDesc(mailbox.peer, mailbox.endpoint, mailbox.target)
        self.node.broadcast(wire.ActorMoved(node_id, path, here), exclude=mailbox.peer)

    def _announce_gone(
        self, mailbox: RemoteMailbox, ended: asyncio.Future[BaseException | None]
    ) -> None:
        reason = None if ended.cancelled() else ended.result()
        text = "it stopped" if reason is None else f"it stopped: {reason}"
        gone = wire.ActorGone(mailbox.peer, mailbox.target, text)
        self.node.broadcast(gone, exclude=self.node.node_id)  # a no-op once it is closed

    def worker_died(self, worker: WorkerProcess, error: BaseException) -> None:
        """``worker`` died: forget it, and tell the other workers now rather than once it
        is reaped (after the supervisor's backoff), so their refs to its actor hold from
        now on instead of sending into the void."""
        self.node.disconnect(worker.node_id, error)
        self._announce_down(worker.node_id, str(error))

    def _announce_down(self, node_id: int, reason: str, *, stopped: bool = False) -> None:
        if node_id in self._down:
            return
        self._down.add(node_id)
        actor = self._actors.get(node_id, "")
        wait_s = self.restart_wait if actor else 0.0  # a stopped actor may be restarted
        down = wire.NodeDown(node_id, reason, actor, wait_s, stopped)
        # Other workers may hold direct links to it and refs to its actor.
        self.node.broadcast(down, exclude=node_id)

    def attach(self, worker: WorkerProcess, host: ProcessHost) -> None:
        """Route ``ActorExited`` from ``worker`` to ``host``."""
        self._hosts[worker.node_id] = host

    async def stop(self, worker: WorkerProcess, timeout: float) -> None:
        """Ask ``worker`` to exit; kill it if it has not within ``timeout``."""
        self._hosts.pop(worker.node_id, None)
        self._stopping.add(worker.node_id)  # its end is no loss: see ``NodeDown.stopped``
        with contextlib.suppress(zmq.ZMQError):
            worker.link.send(wire.Shutdown())
        await self._reap(worker.node_id, worker.proc, timeout)

    async def _reap(self, node_id: int, proc: WorkerHandle, timeout: float = 0.0) -> None:
        proc.release()  # the worker exits on EOF even if our Shutdown was lost
        if proc.returncode is None:
            try:
                async with asyncio.timeout(timeout):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await proc.cleanup()  # its process group, the slabs it could not unlink
        stopped = node_id in self._stopping
        self._stopping.discard(node_id)
        error = ActorStoppedError(f"worker {proc.pid}", "it exited")
        self.node.disconnect(node_id, error, count=not stopped)
        self._announce_down(node_id, f"worker {proc.pid} exited", stopped=stopped)
        self._procs.pop(node_id, None)
        self._actors.pop(node_id, None)
        self._down.discard(node_id)

    def _on_control(self, message: wire.WireMessage) -> None:
        match message:
            case wire.Hello(node=node_id):
                hello = self._hello.get(node_id)
                if hello is not None and not hello.done():
                    hello.set_result(message)
            case wire.ActorStarted(node=node_id):
                started = self._started.get(node_id)
                if started is not None and not started.done():
                    started.set_result(message)
            case wire.ActorExited(node=node_id, error_type=error_type, message=text):
                error = error_from_wire(error_type, text) if error_type else None
                started = self._started.get(node_id)
                if started is not None and not started.done():
                    started.set_exception(error or ActorStoppedError(message.name, "exited"))
                    return
                host = self._hosts.get(node_id)
                if host is not None:
                    host.remote_exited(error)
            case _:
                log.warning("parent node ignored %r", message)

    async def close(self) -> None:
        """Kill any worker still running, close the node and remove the runtime dir."""
        for node_id, proc in list(self._procs.items()):
            await self._reap(node_id, proc)
        await self.node.close()
        self.rundir.cleanup()


class ProcessHost(Actor[object]):
    """Hosts a process actor: keeps its worker alive and bound to the ref's mailbox."""

    def __init__(
        self,
        workers: Workers,
        host: WorkerHost,
        actor_cls: type[Actor[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        mailbox: RemoteMailbox,
    ) -> None:
        self.workers = workers
        self.host = host
        self.actor_cls = actor_cls
        self.args = args
        self.kwargs = kwargs
        self.remote = mailbox
        self.worker: WorkerProcess | None = None
        self._watch: asyncio.Task[None] | None = None

    async def on_start(self) -> None:
        """Launch the worker, start the actor in it, bind the mailbox, watch the process."""
        context = self.context
        before = (self.remote.peer, self.remote.target)  # where it ran until now, if it did
        self.worker = worker = await self.workers.launch(self.host)
        try:
            started = await self.workers.spawn_actor(
                worker, self.actor_cls, context.self_ref.name, self.args, self.kwargs, self.remote
            )
        except BaseException:
            await self.workers.stop(worker, context.system.stop_timeout)
            raise
        self.workers.attach(worker, self)
        self.remote.ref = self.context.self_ref
        self.remote.bind(self.workers.node, worker.link, started.name, started.credits)
        self.workers.announce_start(context.self_ref, self.remote, before)
        self._watch = asyncio.get_running_loop().create_task(
            self._watch_process(worker), name=f"watch worker of {context.path}"
        )

    async def _watch_process(self, worker: WorkerProcess) -> None:
        returncode = await worker.proc.wait()
        error = WorkerDiedError(self.context.path, worker.proc.pid, returncode)
        log.warning("%s", error)
        # What it had not taken yet is lost with it: counted (unbinding forgets it).
        self.workers.node.count_lost(worker.node_id, self.remote.unconfirmed)
        # Fail waiting asks now, not after the supervisor's backoff.
        self.remote.unbind()
        self.workers.worker_died(worker, error)
        remoting.fail(self.context.self_ref, error)

    def remote_exited(self, error: BaseException | None) -> None:
        """The actor inside the worker stopped (``error`` None: it stopped itself)."""
        self.remote.unbind()
        remoting.fail(self.context.self_ref, error)

    async def on_stop(self) -> None:
        """Stop the worker process (graceful, then kill)."""
        self.remote.unbind()
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self.worker is not None:
            await self.workers.stop(self.worker, self.context.system.stop_timeout)
            self.worker = None
