"""One measured realtime client of ``bench realtime``: a websocket, several spoken turns.

A client speaks the way a voice agent's caller does, over the OpenAI Realtime
protocol with ``turn_detection: null`` so the end of speech is exact: each turn streams
its clip as 20 ms ``input_audio_buffer.append`` frames at real-time pace (frame ``k``
leaves at ``start + k * 20 ms``), then, at ``start + length`` (the moment a speaker of
the clip stops), sends ``input_audio_buffer.commit`` and ``response.create`` and reads
until that response's ``response.done``. What it measures, from the client's side:

- TTFA: from sending the commit to the response's first ``response.output_audio.delta``.
- RTF of a completed turn: (last audio delta - commit) / seconds of audio received.
- Cancel latency (the turns asked to cancel): ``response.cancel`` is sent on the first
  audio delta; the time to that response's ``response.done``, and its status.
- Underruns of a completed turn: a player that holds the first audio back 200 ms and
  then plays at real time (``omni_actors.audio.playout``) runs dry before the response's
  audio ends; and the silence that cost. The longest gap between two audio deltas.
- Late audio: an audio delta of a response whose ``response.done`` was already read
  (counted over the whole connection; after the last turn an
  ``input_audio_buffer.clear`` is a barrier, so a delta the server sent after the last
  ``response.done`` is read before the client leaves).
- Errors: ``error`` events and failed responses by code, and the client's own failures
  (a deadline passed, the connection dropped) under ``client.*`` codes.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec
import torch
import websockets

from omni_actors.audio.playout import Playout
from omni_actors.bench.input_length import FRAME_S
from omni_actors.protocols.realtime_client import (
    AudioFormat,
    AudioInputConfig,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    ResponseCancel,
    ResponseCreate,
    SessionAudioConfig,
    SessionConfig,
    SessionUpdate,
)

__all__ = ["CLIENT_RATE", "ClientReport", "TurnResult", "encode_frames", "run_client"]

CLIENT_RATE = 24_000
"""PCM16 mono at 24 kHz: what a Realtime client sends and receives."""
_BYTES_PER_SAMPLE = 2

_encoder = msgspec.json.Encoder()


class _Status(msgspec.Struct, frozen=True):
    type: str | None = None
    error: _Error | None = None


class _Error(msgspec.Struct, frozen=True):
    code: str | None = None
    message: str | None = None


class _Response(msgspec.Struct, frozen=True):
    id: str
    status: str | None = None
    status_details: _Status | None = None


class _Incoming(msgspec.Struct, frozen=True):
    """The fields of a server event the client reads (the rest is skipped)."""

    type: str
    response_id: str | None = None
    delta: str | None = None
    response: _Response | None = None
    error: _Error | None = None


_decoder = msgspec.json.Decoder(_Incoming)


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One turn's figures (times in ms; ``None`` where the turn did not get there).

    Attributes:
        status: the response's final status (``completed``, ``cancelled``, ``failed``),
            or ``client.*`` when the client gave up on it.
        ttfa_ms: commit to the first audio delta.
        rtf: (last audio delta - commit) / seconds of audio, completed turns only.
        audio_s: seconds of audio received.
        cancel_ms: ``response.cancel`` to ``response.done`` (cancelled turns only).
        send_lag_ms: how late the most late frame of the turn left.
        underruns: times the client's player would have run dry (completed turns; 0
            for the others, whose audio stops on purpose).
        stall_ms: the silence those underruns cost.
        gap_max_ms: the longest wait between two audio deltas (None with fewer than two).
    """

    status: str
    ttfa_ms: float | None
    rtf: float | None
    audio_s: float
    cancel_ms: float | None
    send_lag_ms: float
    underruns: int = 0
    stall_ms: float = 0.0
    gap_max_ms: float | None = None


@dataclass(slots=True)
class ClientReport:
    """What one client saw over its connection."""

    turns: list[TurnResult] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    late_audio_deltas: int = 0
    connected_s: float = 0.0


def encode_frames(clip: torch.Tensor) -> list[str]:
    """``clip`` (float samples at 24 kHz) as the JSON of its 20 ms
    ``input_audio_buffer.append`` events, PCM16 little-endian base64: built before the
    clock starts, so pacing sends prepared text."""
    pcm = (clip.clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16).numpy().astype("<i2")
    step = round(FRAME_S * CLIENT_RATE)
    return [
        _encoder.encode(
            InputAudioBufferAppend(audio=base64.b64encode(pcm[i : i + step].tobytes()).decode())
        ).decode()
        for i in range(0, pcm.size, step)
    ]


def _samples(delta: str) -> int:
    size = len(delta) * 3 // 4 - delta.count("=", -2)
    return size // _BYTES_PER_SAMPLE


class _ClientError(Exception):
    """The client gave up on its connection: ``code`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Connection:
    """A websocket and what it has read so far: errors and finished responses."""

    def __init__(self, ws: websockets.ClientConnection, report: ClientReport) -> None:
        self.ws = ws
        self.report = report
        self.done_ids: set[str] = set()

    async def send(self, event: msgspec.Struct) -> None:
        await self.ws.send(_encoder.encode(event).decode())

    async def next(self, deadline: float) -> _Incoming:
        """The next server event, counting late audio deltas and errors as they pass."""
        try:
            async with asyncio.timeout_at(deadline):
                raw = await self.ws.recv()
        except TimeoutError:
            raise _ClientError("client.timeout", "no server event before the deadline") from None
        except websockets.ConnectionClosed as exc:
            raise _ClientError("client.connection_closed", str(exc)) from None
        try:
            event = _decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise _ClientError("client.bad_event", f"not a server event: {exc}") from None
        if event.type == "response.output_audio.delta" and event.response_id in self.done_ids:
            self.report.late_audio_deltas += 1
        elif event.type == "error":
            self.report.errors[(event.error and event.error.code) or "unknown"] += 1
        return event

    async def until(self, kind: str, deadline: float) -> _Incoming:
        """Read up to the next event of type ``kind``."""
        while True:
            event = await self.next(deadline)
            if event.type == kind:
                return event


async def _paced(conn: _Connection, frames: list[str]) -> float:
    """Send ``frames`` at real-time pace and return at the end of speech (when the last
    frame has played); the worst lateness of a frame, in seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    lag = 0.0
    for k, frame in enumerate(frames):
        due = start + k * FRAME_S
        await asyncio.sleep(max(0.0, due - loop.time()))
        lag = max(lag, loop.time() - due)
        await conn.ws.send(frame)
    await asyncio.sleep(max(0.0, start + len(frames) * FRAME_S - loop.time()))
    return lag


async def _turn(
    conn: _Connection, frames: list[str], *, cancel: bool, timeout_s: float
) -> TurnResult:
    """One spoken turn and its response (see the module docstring)."""
    lag = await _paced(conn, frames)
    committed = time.perf_counter()
    await conn.send(InputAudioBufferCommit())
    await conn.send(ResponseCreate())
    deadline = asyncio.get_running_loop().time() + timeout_s
    created = await conn.until("response.created", deadline)
    if created.response is None:
        raise _ClientError("client.bad_event", "response.created without its response")
    rid = created.response.id
    first: float | None = None
    last = committed
    samples = 0
    playout = Playout()
    cancelled_at: float | None = None
    while True:
        event = await conn.next(deadline)
        now = time.perf_counter()
        if event.type == "response.output_audio.delta" and event.response_id == rid:
            got = _samples(event.delta or "")
            samples += got
            playout.add(now, got / CLIENT_RATE)
            last = now
            if first is None:
                first = now
                if cancel:
                    await conn.send(ResponseCancel(response_id=rid))
                    cancelled_at = time.perf_counter()
        elif event.type == "response.done" and event.response and event.response.id == rid:
            done = event.response
            break
    conn.done_ids.add(rid)
    status = done.status or "unknown"
    if status == "incomplete":  # cut at its most tokens: a whole reply, all of it voiced
        status = "completed"
    if status == "failed":
        details = done.status_details
        code = (details and details.error and details.error.code) or "unknown"
        conn.report.errors[f"response_failed.{code}"] += 1
    audio_s = samples / CLIENT_RATE
    completed = status == "completed"
    gap = playout.gap_max_s
    return TurnResult(
        status=status,
        ttfa_ms=None if first is None else (first - committed) * 1e3,
        rtf=(last - committed) / audio_s if completed and audio_s else None,
        audio_s=audio_s,
        cancel_ms=None if cancelled_at is None else (now - cancelled_at) * 1e3,
        send_lag_ms=lag * 1e3,
        underruns=playout.underruns if completed else 0,
        stall_ms=playout.stall_s * 1e3 if completed else 0.0,
        gap_max_ms=None if gap is None else gap * 1e3,
    )


_NO_TURN_DETECTION = SessionUpdate(
    session=SessionConfig(
        type="realtime",
        output_modalities=["audio"],
        audio=SessionAudioConfig(
            input=AudioInputConfig(
                format=AudioFormat(type="audio/pcm", rate=CLIENT_RATE), turn_detection=None
            )
        ),
    )
)


async def run_client(
    ws_url: str,
    turns: list[list[str]],
    *,
    cancel_last: bool,
    timeout_s: float,
    api_key: str | None = None,
) -> ClientReport:
    """Connect to ``ws_url``, speak ``turns`` (each a clip's append frames, from
    :func:`encode_frames`) one after the other, and report what was seen.

    Args:
        ws_url: the server's ``/v1/realtime`` URL.
        turns: the frames of each turn.
        cancel_last: cancel the last turn's response on its first audio delta.
        timeout_s: the deadline of each step: connecting, a response from its commit
            to its ``response.done``, the closing barrier.
        api_key: the server's key, sent as ``Authorization: Bearer`` (none: no header).

    Returns:
        The report; a client that gave up records why in ``errors`` (``client.*``)
        and the turns it finished.
    """
    report = ClientReport()
    loop = asyncio.get_running_loop()
    opened = time.perf_counter()
    try:
        # The library's defaults otherwise (permessage-deflate included), as the
        # ``openai`` client and browsers negotiate it: the server's CPU is what theirs is.
        headers = None if api_key is None else {"Authorization": f"Bearer {api_key}"}
        async with websockets.connect(
            ws_url, open_timeout=timeout_s, max_size=None, additional_headers=headers
        ) as ws:
            opened = time.perf_counter()
            conn = _Connection(ws, report)
            try:
                await conn.until("session.created", loop.time() + timeout_s)
                await conn.send(_NO_TURN_DETECTION)
                await conn.until("session.updated", loop.time() + timeout_s)
                for i, frames in enumerate(turns):
                    cancel = cancel_last and i == len(turns) - 1
                    report.turns.append(
                        await _turn(conn, frames, cancel=cancel, timeout_s=timeout_s)
                    )
                # A barrier: whatever the server sent before ``cleared`` is read (and
                # a late audio delta counted) before the client leaves.
                await conn.send(InputAudioBufferClear())
                await conn.until("input_audio_buffer.cleared", loop.time() + timeout_s)
            finally:
                report.connected_s = time.perf_counter() - opened
    except _ClientError as exc:
        report.errors[exc.code] += 1
    except websockets.ConnectionClosed:
        report.errors["client.connection_closed"] += 1
    except (OSError, TimeoutError, websockets.InvalidHandshake):
        report.errors["client.connect_failed"] += 1
    return report
