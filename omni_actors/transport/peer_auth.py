"""Who may connect to a node's inbox: the processes of one deployment, by token.

The IPC inbox lies in a private (0700) directory, so only this user's processes can
reach it — but every one of them can: a stale tool, a fuzzer, a process of another
deployment. The parent therefore draws a random token per deployment and hands it to
each worker at spawn (in the environment, which only this user can read, and which the
worker clears before starting anything). Every link presents it in ZeroMQ's PLAIN
handshake and the inbox admits a connection only if the token matches, so a process
without it never gets a single frame to the node.

The check runs once per connection, in a ZAP handler served on the node's own event
loop (no thread): frames on an admitted connection cost nothing more. A process that
connects without PLAIN at all fails ZeroMQ's handshake (mechanism mismatch) before any
request reaches us, so it is not counted. Everything a peer holding the token sends is
trusted as the deployment's own; the node's structural checks (malformed frames,
replays, credit limits) still keep a buggy peer from hurting it.

PLAIN sends the token in clear, which is fine over an IPC socket on one host; links
between hosts use TCP with CURVE keys instead (``endpoints.CurveKeys``). There the same
handler admits a connection only if its client key is one of the deployment's nodes'
(the set the node keeps as it learns them): the key pair proves who connects, and each
node's secret key never leaves the process that generated it.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import zmq
import zmq.utils.z85

from omni_actors.transport.refusals import Refusals

if TYPE_CHECKING:
    from omni_actors.transport.endpoints import CurveKeys

__all__ = [
    "TOKEN_ENV",
    "KeyRing",
    "PeerAuthenticator",
    "apply_client",
    "guard_inbox",
    "new_token",
    "take_token",
]

TOKEN_ENV = "OMNI_ACTORS_DEPLOYMENT_TOKEN"
"""Environment variable through which a worker receives its deployment's token."""

_ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27)
_DOMAIN = b"omni-actors"
_POLLIN = int(zmq.POLLIN)


def new_token() -> bytes:
    """A fresh deployment token (128 random bits, hex: PLAIN wants printable bytes)."""
    return secrets.token_hex(16).encode()


def take_token() -> bytes | None:
    """This worker's token, removed from the environment so children do not inherit it."""
    token = os.environ.pop(TOKEN_ENV, None)
    return token.encode() if token else None


def apply_client(socket: zmq.Socket[Any], node_id: int, token: bytes) -> None:
    """Make a link present ``token`` (and its node id, for the log) when it connects."""
    socket.plain_username = str(node_id).encode()
    socket.plain_password = token


def guard_inbox(
    ctx: zmq.Context[Any],
    inbox: zmq.Socket[Any],
    refusals: Refusals,
    curve: CurveKeys | None,
    token: bytes | None,
    keys: KeyRing,
) -> PeerAuthenticator | None:
    """Make ``inbox`` (not bound yet) admit only the deployment's processes: by CURVE
    key in ``keys`` over TCP, else by ``token``; None: neither, it admits anyone who
    can reach it (this user's processes, for an IPC inbox)."""
    if curve is not None:
        curve.apply_server(inbox)
        auth = PeerAuthenticator(ctx, refusals, keys=keys.admitted)
    elif token is not None:
        auth = PeerAuthenticator(ctx, refusals, token=token)
    else:
        return None
    auth.start(inbox)
    return auth


class KeyRing(Mapping[int, bytes]):
    """The CURVE public keys (Z85) of the nodes a TCP node links to and admits, by node.

    ``admitted`` is what the authenticator checks a client's key against: these keys,
    and any given at the start (``CurveKeys.peers``).
    """

    def __init__(self, initial: Iterable[bytes] = ()) -> None:
        self._by_node: dict[int, bytes] = {}
        self.admitted: set[bytes] = set(initial)

    def add(self, node: int, public: bytes) -> None:
        """Admit ``node``'s key (replacing the one it had)."""
        self.forget(node)
        self._by_node[node] = public
        self.admitted.add(public)

    def forget(self, node: int) -> None:
        """``node`` left: it may not connect again."""
        public = self._by_node.pop(node, None)
        if public is not None:
            self.admitted.discard(public)

    def __getitem__(self, node: int) -> bytes:
        return self._by_node[node]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_node)

    def __len__(self) -> int:
        return len(self._by_node)


class PeerAuthenticator:
    """Admits connections to one inbox only from the deployment's processes.

    Args:
        ctx: the node's ZeroMQ context (ZAP requests stay inside it).
        refusals: where refused connections are counted.
        token: the deployment token (PLAIN, on an IPC inbox).
        keys: the CURVE public keys (Z85) admitted (on a TCP inbox); the caller keeps
            adding and removing keys as nodes join and leave.
    """

    def __init__(
        self,
        ctx: zmq.Context[Any],
        refusals: Refusals,
        *,
        token: bytes | None = None,
        keys: set[bytes] | None = None,
    ) -> None:
        if (token is None) == (keys is None):
            raise ValueError("a PeerAuthenticator checks a token or CURVE keys: give one")
        self._token = token
        self._keys = keys
        self._refusals = refusals
        self._zap: zmq.Socket[bytes] = ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, inbox: zmq.Socket[Any]) -> None:
        """Serve ZAP requests on the running loop; make ``inbox`` require PLAIN (with a
        token; with keys, the caller has made it a CURVE server).

        Call before ``inbox`` binds: a connection accepted earlier would not be checked.
        """
        self._zap.bind(_ZAP_ENDPOINT)
        if self._token is not None:
            inbox.plain_server = True
        inbox.zap_domain = _DOMAIN
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._zap.FD, self._on_readable)
        self._loop.call_soon(self._on_readable)  # the FD is edge-triggered

    def stop(self) -> None:
        """Stop serving and close the ZAP socket."""
        if self._loop is not None:
            self._loop.remove_reader(self._zap.FD)
            self._loop = None
        self._zap.close(linger=0)

    def _on_readable(self) -> None:
        zap = self._zap
        while True:
            try:
                if not int(zap.get(zmq.EVENTS)) & _POLLIN:
                    return
                request = zap.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return  # closed under us during shutdown
            try:
                zap.send_multipart(self._answer(request))
            except zmq.ZMQError:
                return

    def _answer(self, request: list[bytes]) -> list[bytes]:
        # version, request id, domain, address, routing id, mechanism, credentials...
        if len(request) < 6 or request[0] != b"1.0":
            self._refusals.refuse("malformed authentication request", len(request))
            request_id = request[1] if len(request) > 1 else b""
            return [b"1.0", request_id, b"500", b"malformed request", b"", b""]
        request_id, address, mechanism = request[1], request[3], request[5]
        credentials = request[6:]
        token, keys = self._token, self._keys
        if token is not None and mechanism == b"PLAIN" and len(credentials) == 2:
            user, password = credentials
            # Constant time: the comparison must not tell a guesser how much it got right.
            if hmac.compare_digest(password, token):
                return [b"1.0", request_id, b"200", b"OK", user, b""]
        if keys is not None and mechanism == b"CURVE" and len(credentials) == 1:
            # A public key is no secret: a set lookup tells a guesser nothing.
            key = zmq.utils.z85.encode(credentials[0])
            if key in keys:
                return [b"1.0", request_id, b"200", b"OK", key, b""]
        what = "deployment token" if token is not None else "key of a deployment node"
        self._refusals.refuse(
            f"connection without the {what}",
            f"{mechanism.decode(errors='replace')} connection from {address!r} refused",
        )
        return [b"1.0", request_id, b"400", f"no {what}".encode(), b"", b""]
