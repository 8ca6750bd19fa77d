"""Where a process actor's worker runs, and how it is started there.

A :class:`WorkerHost` starts one worker process for a :class:`WorkerLaunch` and hands
back a :class:`WorkerHandle`: the parent's view of that process, wherever it runs. The
process placement (``process_placement``) drives every host the same way — start, wait
for the worker's greeting, watch for its exit, stop — so a worker on this machine and
one on another node of a cluster (``omni_actors.cluster``) differ only here.

Two networks join a parent to its workers: this host's private IPC directory
(:data:`IPC`, with the deployment token) or TCP with CURVE keys (a :class:`TcpNetwork`),
which workers on other hosts need. :class:`LocalHost` starts a worker on this machine,
on either network.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Protocol

from omni_actors.transport import shm

__all__ = [
    "IPC",
    "LOCAL",
    "LocalHost",
    "LocalWorker",
    "TcpNetwork",
    "WorkerHandle",
    "WorkerHost",
    "WorkerLaunch",
]


@dataclass(frozen=True, slots=True)
class TcpNetwork:
    """Parent and workers linked over TCP with CURVE keys (each node its own pair).

    Attributes:
        bind: the address the parent's node listens on; it must be reachable from every
            host that runs a worker.
    """

    bind: str = "127.0.0.1"


IPC = None
"""The network of workers on this host: IPC in a private directory (``RuntimeDir``)."""


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """What a host needs to start one worker.

    Attributes:
        node_id: the worker's node id.
        parent: the parent node's endpoint.
        endpoint: where the worker listens (IPC); None: a TCP port of the host it runs
            on, which the host fills in (``tcp://ADDRESS:*``).
        parent_key: the parent's CURVE public key (TCP workers only).
        log_level: the worker's logging level.
        env: environment the worker needs beyond the host's (the deployment token).
    """

    node_id: int
    parent: str
    endpoint: str | None
    parent_key: bytes | None
    log_level: str
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, endpoint: str | None) -> list[str]:
        """The worker's arguments after the interpreter, listening at ``endpoint`` (None:
        the host adds ``--endpoint`` itself)."""
        argv = ["-m", "omni_actors.transport.worker_main", "--node", str(self.node_id)]
        argv += ["--parent", self.parent, "--log-level", self.log_level]
        if endpoint is not None:
            argv += ["--endpoint", endpoint]
        if self.parent_key is not None:
            # Public: argv is fine. One word: a Z85 key may start with "-".
            argv.append(f"--parent-key={self.parent_key.decode()}")
        return argv


class WorkerHandle(Protocol):
    """A started worker process, seen from the parent."""

    @property
    def pid(self) -> int:
        """Its process id (on the host it runs on)."""
        ...

    @property
    def returncode(self) -> int | None:
        """Its exit status; None while it runs."""
        ...

    async def wait(self) -> int:
        """Wait for it to exit (or be lost with its host); its exit status."""
        ...

    async def announcement(self) -> str:
        """A TCP worker's first line on stdout (``worker_main.ANNOUNCE``)."""
        ...

    def release(self) -> None:
        """Close its stdin: a worker exits when it sees that (its parent left)."""
        ...

    def kill(self) -> None:
        """Kill it now."""
        ...

    async def cleanup(self) -> None:
        """After it exited: end what it left behind (its process group, its slabs)."""
        ...


class WorkerHost(Protocol):
    """Where workers start; ``network`` says how they link to the parent."""

    @property
    def network(self) -> TcpNetwork | None:
        """The network its workers use: :data:`IPC` or a :class:`TcpNetwork`."""
        ...

    async def start(self, launch: WorkerLaunch) -> WorkerHandle:
        """Start a worker for ``launch``."""
        ...


@dataclass(frozen=True, slots=True)
class LocalHost:
    """Workers on this machine: over IPC (``network`` :data:`IPC`) or, inside a
    pipeline whose other stages run on a cluster, over its TCP network."""

    network: TcpNetwork | None = IPC

    async def start(self, launch: WorkerLaunch) -> LocalWorker:
        """Start the worker as a child process, in a process group of its own."""
        env = dict(os.environ)
        # The worker imports actor classes by name: give it the parent's import path.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env.update(launch.env)  # a secret goes here, not in argv: others can read that
        tcp = launch.endpoint is None
        bind = self.network.bind if self.network is not None else "127.0.0.1"
        endpoint = f"tcp://{bind}:*" if launch.endpoint is None else launch.endpoint
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *launch.argv(endpoint),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE if tcp else None,
            env=env,
            # The worker leads a process group of its own: whatever it starts (vLLM's
            # EngineCore and its workers) is in it, and ``cleanup`` ends the group however
            # the worker ended. A SIGKILLed worker cannot stop its children itself.
            start_new_session=True,
        )
        return LocalWorker(proc)


LOCAL = LocalHost()
"""Workers on this machine over IPC: where a process actor runs unless told otherwise."""


class LocalWorker:
    """A worker that is a child process of this one."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status; None while it runs."""
        return self.proc.returncode

    async def wait(self) -> int:
        """Wait for it to exit; its exit status."""
        return await self.proc.wait()

    async def announcement(self) -> str:
        """Its first line on stdout (empty if it closed stdout first)."""
        if self.proc.stdout is None:
            raise RuntimeError("an IPC worker announces nothing on stdout")
        line = await self.proc.stdout.readline()
        return line.decode(errors="replace").strip()

    def release(self) -> None:
        """Close its stdin."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def kill(self) -> None:
        """SIGKILL it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    async def cleanup(self) -> None:
        """SIGKILL what is left of its process group, remove the slabs it could not.

        A pid is not handed out again while a group of that id has members, so this
        reaches the processes the worker started (and nothing, once they are gone).
        """
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        shm.sweep(self.proc.pid)
