"""``WorkerKeeper``: the Ray actor that starts and watches one stage worker on its node.

It runs inside Ray (one per stage worker, in the stage's placement-group bundle, with
the stage's resources: a GPU Ray assigns shows in its ``CUDA_VISIBLE_DEVICES``, which
the worker inherits). It starts ``omni_actors.transport.worker_main`` as a child, in a
process group of its own, reads the line the worker announces itself with, and returns
it. The worker's stdin is a pipe from the keeper: if the keeper dies (its node is
removed, Ray kills it), the pipe closes and the worker exits by itself.

``ray_hosts`` makes the class a Ray actor; this module asks Ray only for the node's
address and id. Its methods block (the keeper is a threaded actor), and take and return only
strings and numbers.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
from typing import Any

from omni_actors.transport import shm

__all__ = ["WorkerKeeper"]


class WorkerKeeper:
    """Starts one worker on this node, waits on it, stops it."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: list[str], address: str = "") -> tuple[int, str, str]:
        """Start the worker with ``argv`` (``WorkerLaunch.argv``, its ``--endpoint`` still
        to add) listening on a TCP port of ``address`` (empty: this node's address as
        Ray knows it); its pid, the line it announced itself with, and this node's id.

        Blocks until the worker announces itself or closes its stdout.
        """
        if self._proc is not None:
            raise RuntimeError("a keeper starts one worker")
        command = [sys.executable, *argv, "--endpoint", f"tcp://{address or _node_address()}:*"]
        self._proc = proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # its group: ``stop`` ends whatever it started
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode(errors="replace").strip()
        proc.stdout.close()  # the worker sends the rest of its stdout to stderr
        ray: Any = importlib.import_module("ray")
        return proc.pid, line, str(ray.get_runtime_context().get_node_id())

    def wait(self) -> int:
        """Block until the worker exits; its exit status."""
        if self._proc is None:
            raise RuntimeError("no worker was started")
        return self._proc.wait()

    def release(self) -> None:
        """Close the worker's stdin: it exits when it sees that."""
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def kill(self) -> None:
        """SIGKILL the worker and its process group."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)

    def cleanup(self) -> int | None:
        """After the worker exited: end its group, remove slabs it could not unlink."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self.kill()
            proc.wait()
        self.kill()  # what the worker started, if anything outlived it
        shm.sweep(proc.pid)
        return proc.returncode


def _node_address() -> str:
    """This node's address as Ray knows it (reachable from the cluster's other nodes)."""
    ray_util: Any = importlib.import_module("ray.util")  # untyped
    return str(ray_util.get_node_ip_address())
