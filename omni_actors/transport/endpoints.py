"""Where nodes listen: a private IPC directory on one host, or TCP with CURVE keys."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from typing import Any

import zmq

__all__ = ["CurveKeys", "RuntimeDir"]


class RuntimeDir:
    """A private (mode 0700) directory for IPC sockets, removed on :meth:`cleanup`.

    Only the owning user can connect to sockets inside it, so same-host IPC needs no
    further authentication.
    """

    def __init__(self, prefix: str = "omni-actors-") -> None:
        self.path = tempfile.mkdtemp(prefix=prefix)
        os.chmod(self.path, stat.S_IRWXU)

    def endpoint(self, node: int) -> str:
        """The IPC endpoint of node number ``node``."""
        return f"ipc://{self.path}/n{node}"

    def cleanup(self) -> None:
        """Remove the directory and any socket files left in it."""
        shutil.rmtree(self.path, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """CURVE keys (Z85 bytes) for a node that listens or connects over TCP.

    Attributes:
        public: this node's public key.
        secret: this node's secret key.
        peers: public keys of nodes allowed to connect from the start; a node admits
            these and the keys it learns later (``Node.peer_keys``), no others.
    """

    public: bytes
    secret: bytes
    peers: tuple[bytes, ...] = ()

    @classmethod
    def generate(cls, peers: tuple[bytes, ...] = ()) -> CurveKeys:
        """A fresh key pair (needs libzmq built with CURVE, as pyzmq's wheels are)."""
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq has no CURVE support; use IPC or a VPN")
        public, secret = zmq.curve_keypair()
        return cls(public, secret, peers)

    def apply_server(self, socket: zmq.Socket[Any]) -> None:
        """Configure a listening socket."""
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_server = True

    def apply_client(self, socket: zmq.Socket[Any], server_public: bytes) -> None:
        """Configure a connecting socket for a server with ``server_public``."""
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_serverkey = server_public
