"""An aiortc caller of ``POST /v1/realtime/calls``, as a browser calls OpenAI's.

It offers a microphone track (:class:`Microphone`: what the test makes it say, paced at
real time, silence otherwise) and the ``oai-events`` data channel, posts the offer,
and reads the server's events from the channel and its reply track: how much loud audio
arrived (``heard_ms``). Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import av
import httpx
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

DEADLINE_S = 20.0
RATE = 48_000
_FRAME = RATE // 50
LOUD_RMS = 0.05  # a frame of the reply's tone, not Opus's noise floor


def speech(seconds: float, *, level: float = 0.5) -> np.ndarray:
    """A voiced sound (harmonics of a gliding 140 Hz pitch), int16 at 48 kHz: loud enough
    for the server's energy VAD."""
    t = np.arange(int(seconds * RATE)) / RATE
    pitch = 140 + 20 * np.sin(2 * np.pi * 1.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 20))
    voiced = level * voiced / np.abs(voiced).max()
    return (voiced * 32767).astype(np.int16)


class Microphone(MediaStreamTrack):
    """The caller's microphone: what :meth:`say` queues, 20 ms a frame, in real time."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[np.ndarray] = deque()
        self._start: float | None = None
        self._pts = 0

    def say(self, samples: np.ndarray) -> None:
        for i in range(0, samples.size, _FRAME):
            piece = np.zeros(_FRAME, dtype=np.int16)
            chunk = samples[i : i + _FRAME]
            piece[: chunk.size] = chunk
            self._queue.append(piece)

    @property
    def speaking(self) -> bool:
        return bool(self._queue)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._pts += _FRAME
            await asyncio.sleep(max(0.0, self._start + self._pts / RATE - now))  # pacing
        samples = self._queue.popleft() if self._queue else np.zeros(_FRAME, dtype=np.int16)
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


def _rms(frame: av.AudioFrame) -> tuple[float, int]:
    """A decoded frame's RMS (in [0, 1]) and its samples per channel."""
    data = frame.to_ndarray().astype(np.float32) / 32768.0
    return float(np.sqrt(np.mean(data**2))), int(frame.samples)


class Caller:
    """One call: the events from the data channel, the reply audio heard."""

    def __init__(self, pc: RTCPeerConnection, mic: Microphone) -> None:
        self.pc = pc
        self.mic = mic
        self.channel: Any = None
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.seen: list[dict[str, Any]] = []
        self.loud_samples = 0  # samples of the reply track with the tone in them
        self.frames = 0  # frames received on the reply track
        self.first_loud_at: float | None = None  # when the first of them came (monotonic)
        self.closed = asyncio.Event()  # the data channel closed
        self.location = ""

    @property
    def heard_ms(self) -> float:
        return 1000.0 * self.loud_samples / RATE

    async def listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            self.frames += 1
            rms, samples = _rms(frame)
            if rms > LOUD_RMS:
                if self.first_loud_at is None:
                    self.first_loud_at = time.monotonic()
                self.loud_samples += samples

    async def send(self, type_: str, **fields: Any) -> None:
        self.channel.send(json.dumps({"type": type_, **fields}))

    async def recv(self, timeout: float = DEADLINE_S) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            event = await self.events.get()
        self.seen.append(event)
        return event

    async def until(self, type_: str, timeout: float = DEADLINE_S) -> list[dict[str, Any]]:
        """Every event up to and including the first of ``type_``."""
        events = []
        async with asyncio.timeout(timeout):
            while True:
                event = await self.recv()
                events.append(event)
                if event["type"] == type_:
                    return events

    async def expect(self, type_: str, timeout: float = DEADLINE_S) -> dict[str, Any]:
        """The next event but ``rate_limits.updated``, which must be of ``type_``."""
        while True:
            event = await self.recv(timeout)
            if event["type"] != "rate_limits.updated" or type_ == "rate_limits.updated":
                assert event["type"] == type_, f"expected {type_}, got {event}"
                return event


async def post_offer(
    base_url: str, sdp: str, *, key: str | None = None, session: dict[str, Any] | None = None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=base_url, timeout=DEADLINE_S) as http:
        if session is None:
            return await http.post(
                "/v1/realtime/calls",
                content=sdp,
                headers={**headers, "Content-Type": "application/sdp"},
            )
        return await http.post(
            "/v1/realtime/calls",
            files={"sdp": (None, sdp), "session": (None, json.dumps(session))},
            headers=headers,
        )


@contextlib.asynccontextmanager
async def call(
    base_url: str,
    *,
    key: str | None = None,
    session: dict[str, Any] | None = None,
    microphone: bool = True,
) -> AsyncIterator[Caller]:
    """A call to the server at ``base_url``, its data channel open (and a microphone
    track, unless ``microphone`` is False); hung up on the way out."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic = Microphone()
    caller = Caller(pc, mic)
    tasks: list[asyncio.Task[None]] = []
    try:
        channel = pc.createDataChannel("oai-events")
        caller.channel = channel
        opened = asyncio.Event()
        channel.on("open", opened.set)
        channel.on("message", lambda data: caller.events.put_nowait(json.loads(data)))
        channel.on("close", caller.closed.set)
        if microphone:
            pc.addTrack(mic)

        @pc.on("track")
        def _track(track: MediaStreamTrack) -> None:
            tasks.append(asyncio.create_task(caller.listen(track), name="caller hears"))

        await pc.setLocalDescription(await pc.createOffer())
        reply = await post_offer(base_url, pc.localDescription.sdp, key=key, session=session)
        assert reply.status_code == 201, reply.text
        assert reply.headers["content-type"].startswith("application/sdp")
        caller.location = reply.headers["location"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=reply.text, type="answer"))
        async with asyncio.timeout(DEADLINE_S):
            await opened.wait()
        yield caller
    finally:
        await pc.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
