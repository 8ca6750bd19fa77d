"""Raw pyzmq echo peer for ``omni-actors bench transport``: receive bytes, send an ack.

Usage: python -m omni_actors.bench.zmq_peer ENDPOINT
"""

from __future__ import annotations

import sys

import zmq


def main(endpoint: str) -> None:
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


if __name__ == "__main__":
    main(sys.argv[1])
