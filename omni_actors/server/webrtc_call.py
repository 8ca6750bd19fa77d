"""One WebRTC call on aiortc: its peer connection, data channel and audio tracks.

Only this module imports aiortc (the ``webrtc`` extra); ``webrtc.py`` imports it when a
call comes, and answers 501 without it. A call is what OpenAI's browser path makes:

- the caller's offer names an audio track (its microphone, Opus at 48 kHz) and a data
  channel, ``oai-events``, that carries the Realtime events both ways as the websocket
  would;
- the answer adds the server's audio track (:class:`ReplyPlayer`): the replies, played
  out in real time, 20 ms a frame, silence between them. Because the player sends each
  frame when it is due, what it has sent is what the caller has heard (to within the
  caller's jitter buffer), and a barge-in cuts the reply there.

:func:`answer_call` builds the peer connection and answers the offer;
:meth:`Call.run` serves the session once the data channel opens, and closes the peer
connection whatever ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import av
import numpy as np
import torch
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from omni_actors.audio.resample import StreamResampler
from omni_actors.protocols.realtime_client import SessionConfig
from omni_actors.server.realtime import RealtimeConnection
from omni_actors.server.realtime_transport import ClientGone, Playout
from omni_actors.server.state import ServerState

__all__ = ["EVENTS_CHANNEL", "RATE", "Call", "DataChannelTransport", "ReplyPlayer", "answer_call"]

log = logging.getLogger(__name__)

RATE = 48_000
"""Opus's rate: what the tracks carry both ways."""
EVENTS_CHANNEL = "oai-events"
"""The data channel's label, as OpenAI's browser clients open it."""

_FRAME = RATE // 50  # 20 ms, Opus's usual frame
_OPEN_S = 30.0  # an answered call whose data channel never opens is dropped
_INBOX = 4096  # client events queued, unread: a client past it is cut off
_BUFFERED = 1 << 20  # bytes queued on the channel before a send waits for the caller
_KEPT = 16  # finished replies whose played length stays known


class DataChannelTransport:
    """A call's ``oai-events`` data channel as a session's transport."""

    def __init__(self) -> None:
        self.channel: RTCDataChannel | None = None
        self.opened = asyncio.Event()
        self._inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._drained = asyncio.Event()

    def attach(self, data_channel: RTCDataChannel) -> None:
        """Take the channel the caller opened."""
        self.channel = data_channel
        data_channel.bufferedAmountLowThreshold = _BUFFERED // 2
        data_channel.on("message", self._message)
        data_channel.on("close", lambda: self._inbox.put_nowait(None))
        data_channel.on("bufferedamountlow", self._drained.set)
        self.opened.set()

    def _message(self, data: str | bytes) -> None:
        if self._inbox.qsize() >= _INBOX:
            log.warning("call: the client sends events faster than they are read; closing")
            self.end()
            return
        self._inbox.put_nowait(data)

    def end(self) -> None:
        """The call ended: :meth:`receive` says the client left."""
        self._inbox.put_nowait(None)

    async def receive(self) -> str | bytes | None:
        """The next message on the channel; None once it closed."""
        return await self._inbox.get()

    async def send(self, text: str) -> None:
        """Send one event; wait while too much is queued for the caller.

        Raises:
            ClientGone: the channel is closed.
        """
        channel = self.channel
        if channel is None or channel.readyState != "open":
            raise ClientGone("the call's data channel is closed")
        channel.send(text)
        while channel.bufferedAmount > _BUFFERED and channel.readyState == "open":
            self._drained.clear()
            await self._drained.wait()

    async def close(self, code: int, reason: str) -> None:
        """Close the channel (a data channel has no close code: the caller sees it close)."""
        if self.channel is not None and self.channel.readyState in ("connecting", "open"):
            self.channel.close()
        self.end()


class ReplyPlayer(MediaStreamTrack):
    """The server's audio track: the replies' audio, paced at real time.

    Each reply's audio is resampled as one stream to 48 kHz and queued; :meth:`recv`
    (called by aiortc's sender, frame after frame) sends the next 20 ms when it is due,
    counting what of each reply went out.
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[tuple[str, np.ndarray]] = deque()  # (reply, int16 samples)
        self._resamplers: dict[str, StreamResampler] = {}  # replies still arriving
        self._played: dict[str, int] = {}  # samples sent, per reply not done playing
        self._finished: deque[str] = deque(maxlen=_KEPT)  # played to their end
        self._start: float | None = None
        self._pts = 0
        self.changes: asyncio.Queue[tuple[Playout, str]] = asyncio.Queue()

    # -- what the session plays ------------------------------------------------------------

    def play(self, response_id: str, samples: torch.Tensor, rate: int) -> None:
        """Queue a piece of a reply (float samples at ``rate``)."""
        resampler = self._resamplers.get(response_id)
        if resampler is None:
            if response_id in self._finished or response_id in self._played:
                return  # stopped: nothing more of it plays
            resampler = self._resamplers[response_id] = StreamResampler(rate, RATE)
            self._played[response_id] = 0
        self._queue_samples(response_id, resampler.push(samples.detach().reshape(-1).cpu()))

    def end(self, response_id: str) -> None:
        """The reply's audio is all queued: its resampler's tail goes too."""
        resampler = self._resamplers.pop(response_id, None)
        if resampler is not None:
            self._queue_samples(response_id, resampler.flush())
            self._retire_if_done(response_id)

    def playing(self, response_id: str) -> bool:
        """Whether some of the reply is queued or playing still."""
        return response_id in self._played

    def cut(self, response_id: str) -> float | None:
        """Stop the reply now: its milliseconds played, or None if it played to its end
        or never began."""
        if response_id not in self._played:
            return None
        self._queue = deque(piece for piece in self._queue if piece[0] != response_id)
        self._resamplers.pop(response_id, None)
        played = self._played.pop(response_id)
        self._finished.append(response_id)
        if played:
            self.changes.put_nowait(("cleared", response_id))
        return 1000.0 * played / RATE

    def played_ms(self, response_id: str) -> float:
        """Milliseconds of the reply sent so far (0 for one not playing)."""
        return 1000.0 * self._played.get(response_id, 0) / RATE

    def _queue_samples(self, response_id: str, samples: torch.Tensor) -> None:
        if samples.numel():
            scaled = np.rint(np.clip(samples.numpy() * 32768.0, -32768, 32767))
            self._queue.append((response_id, scaled.astype(np.int16)))

    def _retire_if_done(self, response_id: str) -> None:
        """A reply whose audio is all sent and none is coming is done playing."""
        if response_id in self._resamplers or any(p[0] == response_id for p in self._queue):
            return
        played = self._played.pop(response_id, None)
        if played is not None:
            self._finished.append(response_id)
            if played:
                self.changes.put_nowait(("stopped", response_id))

    # -- what aiortc sends ---------------------------------------------------------------

    def _next_frame(self) -> np.ndarray:
        frame = np.zeros(_FRAME, dtype=np.int16)
        filled = 0
        while filled < _FRAME and self._queue:
            reply, piece = self._queue[0]
            take = min(_FRAME - filled, piece.size)
            frame[filled : filled + take] = piece[:take]
            filled += take
            if not self._played.get(reply):
                self.changes.put_nowait(("started", reply))
            self._played[reply] = self._played.get(reply, 0) + take
            if take == piece.size:
                self._queue.popleft()
                self._retire_if_done(reply)
            else:
                self._queue[0] = (reply, piece[take:])
        return frame

    async def recv(self) -> av.AudioFrame:
        """The next 20 ms, when it is due (silence between replies)."""
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._pts += _FRAME
            due = self._start + self._pts / RATE
            if due < now - 0.5:  # the loop stalled: start the clock anew, no burst
                self._start, self._pts = now, 0
            else:
                # Pacing, not synchronisation: the frame leaves when a player needs it.
                await asyncio.sleep(max(0.0, due - now))
        frame = av.AudioFrame.from_ndarray(self._next_frame()[None, :], format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


class CallMedia:
    """A call's audio (:class:`~omni_actors.server.realtime_transport.CallAudio`): the
    caller's track in, :class:`ReplyPlayer` out."""

    def __init__(self, player: ReplyPlayer) -> None:
        self.player = player
        self.caller: MediaStreamTrack | None = None
        self.arrived = asyncio.Event()

    def take(self, track: MediaStreamTrack) -> None:
        """The caller's microphone track."""
        self.caller = track
        self.arrived.set()

    async def listen(self, heard: Callable[[torch.Tensor, int], Awaitable[None]]) -> None:
        """Hand the caller's audio to ``heard``, mono int16, until the track ends."""
        await self.arrived.wait()
        assert self.caller is not None
        while True:
            try:
                frame = await self.caller.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, av.AudioFrame):
                continue  # an audio track yields frames: nothing else is audio
            await heard(_mono(frame), int(frame.sample_rate))

    def play(self, response_id: str, samples: torch.Tensor, rate: int) -> None:
        """See :meth:`ReplyPlayer.play`."""
        self.player.play(response_id, samples, rate)

    def end(self, response_id: str) -> None:
        """See :meth:`ReplyPlayer.end`."""
        self.player.end(response_id)

    def playing(self, response_id: str) -> bool:
        """See :meth:`ReplyPlayer.playing`."""
        return self.player.playing(response_id)

    async def playout(self) -> tuple[Playout, str]:
        """The next change of a reply's playout (see ``CallAudio.playout``)."""
        return await self.player.changes.get()

    def cut(self, response_id: str) -> float | None:
        """See :meth:`ReplyPlayer.cut`."""
        return self.player.cut(response_id)


def _mono(frame: av.AudioFrame) -> torch.Tensor:
    """A decoded frame as mono int16 samples (channels averaged)."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    planar = frame.format.is_planar
    samples = data.reshape(channels, -1) if planar else data.reshape(-1, channels).T
    if samples.dtype != np.int16:  # float formats: [-1, 1]
        samples = np.clip(samples.astype(np.float32) * 32768.0, -32768, 32767)
    mono = samples.astype(np.float32).mean(axis=0) if channels > 1 else samples[0]
    return torch.from_numpy(np.rint(mono).astype(np.int16))


class Call:
    """One answered call: its peer connection, until :meth:`run` returns.

    Args:
        call_id: the call's id (``rtc_…``), in its ``Location``.
        state: the server's shared state.
        configs: the session configs it starts from (the key's, the call's own).
    """

    def __init__(self, call_id: str, state: ServerState, configs: Sequence[SessionConfig]) -> None:
        self.id = call_id
        self.state = state
        self.configs = tuple(configs)
        # No ICE servers: host candidates only, and no request leaves for a STUN server.
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.player = ReplyPlayer()
        self.media = CallMedia(self.player)
        self.events = DataChannelTransport()
        self.connection: RealtimeConnection | None = None
        self.lost = asyncio.Event()  # the peer connection failed or closed
        # An offer without audio (a data channel alone) gets its audio in events, as on
        # the websocket.
        self.carries_audio = False

        @self.pc.on("track")
        def _track(track: MediaStreamTrack) -> None:
            if track.kind == "audio" and self.media.caller is None:
                self.media.take(track)

        @self.pc.on("datachannel")
        def _channel(channel: RTCDataChannel) -> None:
            if channel.label == EVENTS_CHANNEL and self.events.channel is None:
                self.events.attach(channel)

        @self.pc.on("connectionstatechange")
        def _state() -> None:
            if self.pc.connectionState in ("failed", "closed"):
                self.lost.set()
                self.events.end()

    async def answer(self, offer: str) -> str:
        """The SDP answer to the caller's ``offer`` (every candidate gathered: no
        trickle ICE, as OpenAI's answer).

        Raises:
            ValueError: the offer is not SDP aiortc can answer.
        """
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        if self.pc.sctp is None:
            raise ValueError(f"the offer opens no data channel (the {EVENTS_CHANNEL} events')")
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio":
                transceiver.sender.replaceTrack(self.player)
                transceiver.direction = "sendrecv"
                self.carries_audio = True
                break
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        answer: str = self.pc.localDescription.sdp
        return answer

    async def _opened(self) -> bool:
        """Wait for the data channel, until the connection is lost or ``_OPEN_S`` pass."""
        waits = [
            asyncio.create_task(self.events.opened.wait(), name=f"call {self.id} opened"),
            asyncio.create_task(self.lost.wait(), name=f"call {self.id} lost"),
        ]
        try:
            await asyncio.wait(waits, timeout=_OPEN_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return self.events.opened.is_set() and not self.lost.is_set()

    async def run(self) -> None:
        """Serve the session once the data channel opens; close the peer connection
        whatever ends the call (the caller, the session, a hang-up, the server)."""
        try:
            if not await self._opened():
                log.warning(
                    "call %s: no %s data channel within %gs", self.id, EVENTS_CHANNEL, _OPEN_S
                )
                return
            self.connection = RealtimeConnection(
                self.events,
                self.state,
                configs=self.configs,
                audio=self.media if self.carries_audio else None,
            )
            await self.connection.serve()
        finally:
            self.player.stop()
            with contextlib.suppress(Exception):
                await self.pc.close()
            log.info("call %s ended", self.id)


async def answer_call(
    call_id: str, state: ServerState, offer: str, configs: Sequence[SessionConfig]
) -> tuple[Call, str]:
    """A new call and its SDP answer to ``offer``; the call's peer connection is closed
    if the offer cannot be answered.

    Raises:
        ValueError: the offer is not SDP aiortc can answer.
    """
    call = Call(call_id, state, configs)
    try:
        return call, await call.answer(offer)
    except BaseException:
        await call.pc.close()
        raise
