"""``ReplyPlayer``, a call's audio track: paced at real time, and it knows what it played."""

from __future__ import annotations

import math
import time

import pytest
import torch
from aiortc.mediastreams import MediaStreamError

from omni_actors.server.webrtc_call import RATE, ReplyPlayer

FRAME = RATE // 50


def tone(seconds: float, rate: int = 24_000) -> torch.Tensor:
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    return (0.3 * torch.sin(2 * math.pi * 440 * t)).to(torch.float32)


async def frames(player: ReplyPlayer, n: int) -> list[float]:
    """The RMS of the next ``n`` frames."""
    rms = []
    for _ in range(n):
        frame = await player.recv()
        assert (frame.sample_rate, frame.samples) == (RATE, FRAME)
        data = frame.to_ndarray().astype("float32") / 32768
        rms.append(float((data**2).mean() ** 0.5))
    return rms


async def test_the_player_sends_a_frame_when_it_is_due() -> None:
    player = ReplyPlayer()
    try:
        await player.recv()  # the clock starts
        began = time.monotonic()
        await frames(player, 10)
        # Real time: ten 20 ms frames take 200 ms (a player would hear them at that pace).
        assert time.monotonic() - began >= 0.19
    finally:
        player.stop()


async def test_a_cut_says_what_was_played_and_the_rest_is_never_played() -> None:
    player = ReplyPlayer()
    try:
        player.play("resp_1", tone(1.0), 24_000)
        played = await frames(player, 10)
        assert all(rms > 0.1 for rms in played[1:])  # the tone, after the resampler's ramp
        assert player.cut("resp_1") == 200.0  # ten frames of it went out
        assert player.cut("resp_1") is None  # cut already
        told = [player.changes.get_nowait() for _ in range(player.changes.qsize())]
        assert told == [("started", "resp_1"), ("cleared", "resp_1")]
        player.play("resp_1", tone(0.5), 24_000)  # what still comes of it is dropped
        assert max(await frames(player, 5)) == 0.0
    finally:
        player.stop()


async def test_a_reply_played_to_its_end_is_not_cut() -> None:
    player = ReplyPlayer()
    try:
        player.play("resp_1", tone(0.1), 24_000)
        player.end("resp_1")
        await frames(player, 8)  # 100 ms of it and the resampler's tail, then silence
        assert player.cut("resp_1") is None
        told = [player.changes.get_nowait() for _ in range(player.changes.qsize())]
        assert told == [("started", "resp_1"), ("stopped", "resp_1")]
        assert player.cut("resp_never") is None
    finally:
        player.stop()


async def test_a_stopped_player_ends_its_track() -> None:
    player = ReplyPlayer()
    player.stop()
    with pytest.raises(MediaStreamError):
        await player.recv()
