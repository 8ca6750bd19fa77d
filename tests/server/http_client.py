"""Plain HTTP for the server tests: ``urllib`` (in a thread, with a deadline) for whole
replies, a raw socket for a client that reads part of a stream and goes away."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

DEADLINE_S = 20.0


def _call(url: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE_S) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, bytes(error.read())


async def get(url: str) -> tuple[int, Any]:
    """GET ``url``: the status and the body (parsed if JSON)."""
    status, body = await asyncio.to_thread(_call, url, None, {})
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


async def post(
    url: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """POST ``body`` (a dict is sent as JSON): the status and the parsed JSON reply."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    all_headers = {"content-type": "application/json", **(headers or {})}
    status, reply = await asyncio.to_thread(_call, url, data, all_headers)
    return status, json.loads(reply)


async def stream_events(url: str, body: dict[str, Any]) -> list[str]:
    """POST ``body`` and read its whole server-sent stream: each event's ``data``."""
    data = json.dumps(body).encode()
    status, reply = await asyncio.to_thread(_call, url, data, {"content-type": "application/json"})
    assert status == 200, reply
    lines = reply.decode().split("\n")
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


class RawStream:
    """One request on a raw socket; read the reply's lines, then close mid-reply."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def line(self) -> str:
        async with asyncio.timeout(DEADLINE_S):
            raw = await self.reader.readline()
        assert raw, "the server closed the connection"
        return raw.decode().rstrip("\r\n")

    async def until(self, prefix: str) -> str:
        """Read lines up to the first that starts with ``prefix``; return it."""
        while not (line := await self.line()).startswith(prefix):
            pass
        return line


@asynccontextmanager
async def raw_post(url: str, payload: dict[str, Any]) -> AsyncIterator[RawStream]:
    """POST ``payload`` over a socket of its own, closed when the block is left."""
    where = urlsplit(url)
    body = json.dumps(payload).encode()
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        head = (
            f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        yield RawStream(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()
