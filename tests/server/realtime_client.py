"""A plain ``websockets`` client of ``/v1/realtime`` for the server tests.

Every wait has a deadline; ``until`` returns the events read on the way, so a test can
assert on their order.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import websockets
from websockets.asyncio.client import ClientConnection

DEADLINE_S = 20.0
RATE = 24_000


def speech(seconds: float, *, rate: int = RATE, level: float = 0.3, seed: int = 0) -> bytes:
    """Loud speech-like PCM16 (tones under noise)."""
    n = int(seconds * rate)
    t = np.arange(n) / rate
    rng = np.random.default_rng(seed)
    x = level * (0.6 * np.sin(2 * math.pi * 220 * t) + 0.4 * rng.standard_normal(n))
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def silence(seconds: float, *, rate: int = RATE) -> bytes:
    return bytes(2 * int(seconds * rate))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class RealtimeClient:
    """One connection: ``send`` events, read them with deadlines.

    A ``rate_limits.updated`` (sent after every ``response.done``) is read on the way,
    kept in ``limits``, unless it is the event asked for.
    """

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.seen: list[dict[str, Any]] = []
        self.limits: list[dict[str, Any]] = []

    async def send(self, type_: str, **fields: Any) -> None:
        await self.ws.send(json.dumps({"type": type_, **fields}))

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def recv(self, timeout: float = DEADLINE_S, *, limits: bool = False) -> dict[str, Any]:
        """The next event (``limits``: a ``rate_limits.updated`` too)."""
        async with asyncio.timeout(timeout):
            while True:
                event: dict[str, Any] = json.loads(await self.ws.recv())
                self.seen.append(event)
                if limits or event["type"] != "rate_limits.updated":
                    return event
                self.limits.append(event)

    async def expect(self, type_: str, timeout: float = DEADLINE_S) -> dict[str, Any]:
        """The next event, which must be of ``type_``."""
        event = await self.recv(timeout, limits=type_ == "rate_limits.updated")
        assert event["type"] == type_, f"expected {type_}, got {event}"
        return event

    async def until(self, type_: str, timeout: float = DEADLINE_S) -> list[dict[str, Any]]:
        """Every event up to and including the first of ``type_``."""
        events = []
        async with asyncio.timeout(timeout):
            while True:
                event = await self.recv(timeout, limits=type_ == "rate_limits.updated")
                events.append(event)
                if event["type"] == type_:
                    return events

    async def error(self, timeout: float = DEADLINE_S) -> dict[str, Any]:
        """The next event, an ``error``; its ``error`` object."""
        event = await self.expect("error", timeout)
        detail: dict[str, Any] = event["error"]
        return detail

    async def no_vad(self) -> None:
        """Turn detection off (the client commits); read ``session.updated``."""
        await self.send(
            "session.update",
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}}},
        )
        await self.expect("session.updated")

    async def ask(self, seconds: float = 0.2, **response: Any) -> None:
        """Turn detection off, ``seconds`` of speech committed, then ``response.create``
        (which leaves the input buffer alone)."""
        await self.no_vad()
        await self.say(speech(seconds))
        await self.send("input_audio_buffer.commit")
        await self.send("response.create", **({"response": response} if response else {}))

    async def say(self, audio: bytes, frame_s: float = 0.1) -> None:
        """Append ``audio`` in frames."""
        step = int(frame_s * RATE) * 2
        for i in range(0, len(audio), step):
            await self.send("input_audio_buffer.append", audio=b64(audio[i : i + step]))


@asynccontextmanager
async def connect(url: str, **kwargs: Any) -> AsyncIterator[RealtimeClient]:
    """Connect and read ``session.created``."""
    async with websockets.connect(url, max_size=None, **kwargs) as ws:
        client = RealtimeClient(ws)
        await client.expect("session.created")
        yield client


def audio_deltas(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "response.output_audio.delta"]
