"""Process actors whose workers link over TCP with CURVE keys, as on a cluster.

Each node (the parent and every worker) has its own key pair; a node admits only the
keys the parent gave it. The workers here run on this machine (``LocalHost`` on a
``TcpNetwork``), through the same launch path a cluster's hosts use.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch
import zmq
from remote_actors import Count, Echo, Forwarder, Payload, Pid, Route

from omni_actors import Backoff, Props, SupervisorStrategy, WorkerDiedError
from omni_actors.remoting import mailbox_of
from omni_actors.testing import ActorTestKit, eventually
from omni_actors.transport.endpoints import CurveKeys
from omni_actors.transport.process_placement import ProcessPlacement, Workers
from omni_actors.transport.remote import RemoteMailbox
from omni_actors.transport.worker_hosts import LocalHost, TcpNetwork

TCP = LocalHost(TcpNetwork("127.0.0.1"))
FAST_RESTART = SupervisorStrategy(backoff=Backoff(min_s=0.0, max_s=0.0, jitter=0.0))


def _endpoint(ref: object) -> str:
    mailbox = mailbox_of(ref)  # type: ignore[arg-type]
    assert isinstance(mailbox, RemoteMailbox)
    return mailbox.endpoint


def _public(workers: Workers) -> bytes:
    assert workers.curve is not None
    return workers.curve.public


def _placement(kit: ActorTestKit) -> ProcessPlacement:
    placement = kit.system._placements["process"]
    assert isinstance(placement, ProcessPlacement)
    return placement


async def test_workers_talk_over_tcp_directly() -> None:
    async with ActorTestKit() as kit:
        props = Props(process=True, host=TCP)
        echo = await kit.spawn(Echo, 3.0, name="echo", props=props)
        forwarder = await kit.spawn(Forwarder, name="forwarder", props=props)
        assert _endpoint(echo).startswith("tcp://127.0.0.1:")
        data = torch.arange(300_000, dtype=torch.float32)  # out of band: no slab over TCP
        await forwarder.tell(Route(echo, Payload(1, data)))
        await forwarder.tell(Route(echo, Payload(2, data[:4])))

        async def both_arrived() -> bool:
            return await echo.ask(Count(), timeout=10) == 2

        await eventually(both_arrived, timeout=20)
        reply = await echo.ask(Payload(3, data), timeout=10)
        assert torch.equal(reply.data, data * 3)
        workers = _placement(kit).workers_of(TCP.network)
        # The parent holds both workers' keys; nothing came in without one.
        assert len(workers.node.peer_keys) == 2
        assert workers.node.refusals.total == 0


async def test_a_client_without_a_deployment_key_is_refused() -> None:
    async with ActorTestKit() as kit:
        echo = await kit.spawn(Echo, name="echo", props=Props(process=True, host=TCP))
        workers = _placement(kit).workers_of(TCP.network)
        server_key = next(iter(workers.node.peer_keys.values()))
        stranger = CurveKeys.generate()
        ctx = zmq.Context()
        for target, key in (
            (workers.node.endpoint, _public(workers)),  # the parent
            (_endpoint(echo), server_key),  # the worker
        ):
            socket = ctx.socket(zmq.PUSH)
            stranger.apply_client(socket, key)
            monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            try:
                socket.connect(target)
                socket.send(b"not a frame", zmq.NOBLOCK)
                # ZeroMQ reports the refusal to the client: its key is not admitted.
                refused_here = await asyncio.to_thread(monitor.poll, 10_000)
            finally:
                socket.disable_monitor()  # the monitor first, or term() waits for it
                monitor.close(linger=0)
                socket.close(linger=0)
            assert refused_here, f"{target} let a stranger in"
        ctx.term()
        refused = workers.node.refusals.counts
        assert refused["connection without the key of a deployment node"] >= 1
        assert await echo.ask(Count(), timeout=10) == 1  # the worker went on (counts this ask)


async def test_a_killed_tcp_worker_restarts_and_its_key_is_forgotten() -> None:
    async with ActorTestKit() as kit:
        props = Props(process=True, host=TCP, restart="permanent", strategy=FAST_RESTART)
        echo = await kit.spawn(Echo, name="echo", props=props)
        workers = _placement(kit).workers_of(TCP.network)
        pid = await echo.ask(Pid(), timeout=10)
        ((old_node, old_key),) = workers.node.peer_keys.items()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            await echo.ask(Count(), timeout=10)

        async def restarted() -> bool:
            try:
                return await echo.ask(Pid(), timeout=10) != pid
            except WorkerDiedError:
                return False

        await eventually(restarted, timeout=30)
        assert old_node not in workers.node.peer_keys
        assert old_key not in workers.node.peer_keys.values()
        assert len(workers.node.peer_keys) == 1


def test_a_parent_key_that_starts_with_a_dash_reaches_the_worker() -> None:
    from omni_actors.transport.worker_hosts import WorkerLaunch
    from omni_actors.transport.worker_main import parse_args

    key = b"-" + b"x" * 39  # Z85 keys may start with "-"
    argv = WorkerLaunch(1, "tcp://127.0.0.1:1", None, key, "INFO").argv("tcp://127.0.0.1:*")
    assert parse_args(argv[2:]).parent_key == key.decode()
