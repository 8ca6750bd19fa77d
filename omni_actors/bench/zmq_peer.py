"""Raw pyzmq echo peer for ``omni-actors bench transport``: receive bytes, send an ack.

Usage: python -m omni_actors.bench.zmq_peer ENDPOINT [--async]

With ``--async`` the peer waits in an event loop on the socket's file descriptor, as
any asyncio program integrating ZeroMQ must, instead of blocking in ``recv``.
"""

from __future__ import annotations

import asyncio
import sys

import zmq

from omni_actors._system import run


def blocking(endpoint: str) -> None:
    """Ack every frame until an empty one arrives."""
    ctx = zmq.Context()
    socket = ctx.socket(zmq.PAIR)
    socket.connect(endpoint)
    try:
        while True:
            frame = socket.recv(copy=False)
            if len(frame) == 0:
                break
            socket.send(b"k")
    finally:
        socket.close(linger=0)
        ctx.term()


async def evented(endpoint: str) -> None:
    """The same, driven by the event loop's reader callback."""
    ctx = zmq.Context()
    socket = ctx.socket(zmq.PAIR)
    socket.connect(endpoint)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def readable() -> None:
        while int(socket.get(zmq.EVENTS)) & int(zmq.POLLIN):
            frame = socket.recv(zmq.NOBLOCK, copy=False)
            if len(frame) == 0:
                done.set()
                return
            socket.send(b"k")

    loop.add_reader(socket.FD, readable)
    loop.call_soon(readable)
    try:
        await done.wait()
    finally:
        loop.remove_reader(socket.FD)
        socket.close(linger=0)
        ctx.term()


if __name__ == "__main__":
    if sys.argv[2:] == ["--async"]:
        run(evented(sys.argv[1]))
    else:
        blocking(sys.argv[1])
