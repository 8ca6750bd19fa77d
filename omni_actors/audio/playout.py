"""``Playout``: how a listener's player would have played a response's audio as it came.

A client plays audio at real time from a jitter buffer: it holds the first packet back
``buffer_s`` (200 ms by default, what voice clients commonly hold), then plays samples at
the rate they were made. If the buffer runs dry before the next packet arrives, the
listener hears a stall (an underrun); the player buffers ``buffer_s`` again from that
packet on. Audio that arrives fast and audio that arrives late but inside the buffer
sound alike, so what a listener notices is counted here: underruns and the silence they
cost, not the raw gaps between packets (those are kept too, for where a stall came from).

The same account is taken by the session (``PendingResponse``, from the events as they
reach the session's owner) and by ``bench realtime``'s clients (from the websocket), so
the two figures mean the same thing.
"""

from __future__ import annotations

__all__ = ["JITTER_BUFFER_S", "Playout"]

JITTER_BUFFER_S = 0.2
"""How long a player holds the first packet (and the first after an underrun) back."""


class Playout:
    """Plays one response's audio at real time after a jitter buffer, on paper.

    Args:
        buffer_s: the jitter buffer, in seconds of wall time.

    Attributes:
        packets: audio packets received.
        audio_s: seconds of audio received.
        underruns: times the buffer ran dry before the response's audio ended.
        stall_s: seconds of silence those underruns cost (each until the next packet
            arrived and was buffered again).
        gaps: seconds between the arrivals of consecutive packets.
    """

    __slots__ = (
        "_ends_at",
        "_last",
        "audio_s",
        "buffer_s",
        "gaps",
        "packets",
        "stall_s",
        "underruns",
    )

    def __init__(self, buffer_s: float = JITTER_BUFFER_S) -> None:
        if buffer_s < 0:
            raise ValueError(f"a jitter buffer of {buffer_s} s: pass 0 or more")
        self.buffer_s = buffer_s
        self.packets = 0
        self.audio_s = 0.0
        self.underruns = 0
        self.stall_s = 0.0
        self.gaps: list[float] = []
        self._last: float | None = None  # when the last packet arrived
        self._ends_at = 0.0  # when the audio received so far has played out

    def add(self, now: float, seconds: float) -> None:
        """A packet of ``seconds`` of audio arrived at ``now`` (any monotonic clock)."""
        if seconds <= 0:
            return  # an empty packet plays nothing and fills nothing
        if self._last is None:
            self._ends_at = now + self.buffer_s
        else:
            self.gaps.append(now - self._last)
            if now > self._ends_at:  # the player ran dry before this packet came
                self.underruns += 1
                self.stall_s += now + self.buffer_s - self._ends_at
                self._ends_at = now + self.buffer_s
        self._ends_at += seconds
        self._last = now
        self.packets += 1
        self.audio_s += seconds

    @property
    def gap_max_s(self) -> float | None:
        """The longest wait between two packets (None before a second packet)."""
        return max(self.gaps) if self.gaps else None

    @property
    def underruns_per_min(self) -> float:
        """Underruns per minute of audio received (0 without audio)."""
        return self.underruns * 60.0 / self.audio_s if self.audio_s else 0.0
