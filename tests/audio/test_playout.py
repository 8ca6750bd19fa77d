"""``Playout``: a player that holds the first audio back by a jitter buffer, then plays at
real time, counts the times it runs dry and the silence that costs."""

from __future__ import annotations

import pytest

from omni_actors.audio.playout import JITTER_BUFFER_S, Playout


def test_audio_that_keeps_ahead_of_the_player_never_runs_dry() -> None:
    playout = Playout()
    for k in range(50):  # 20 ms packets every 20 ms: exactly real time
        playout.add(k * 0.02, 0.02)
    assert (playout.packets, playout.underruns, playout.stall_s) == (50, 0, 0.0)
    assert playout.audio_s == pytest.approx(1.0)
    assert playout.gap_max_s == pytest.approx(0.02)
    assert playout.buffer_s == JITTER_BUFFER_S == 0.2


def test_a_late_packet_inside_the_buffer_is_not_heard() -> None:
    playout = Playout(buffer_s=0.2)
    playout.add(0.0, 0.1)  # plays from 0.2 s to 0.3 s
    playout.add(0.29, 0.1)  # arrives before the first has played out
    assert playout.underruns == 0
    assert playout.gap_max_s == pytest.approx(0.29)


def test_a_packet_after_the_buffer_ran_dry_is_an_underrun_and_its_stall() -> None:
    playout = Playout(buffer_s=0.2)
    playout.add(0.0, 0.1)  # plays from 0.2 s to 0.3 s
    playout.add(0.5, 0.1)  # dry from 0.3 s; buffered again, plays from 0.7 s
    assert playout.underruns == 1
    assert playout.stall_s == pytest.approx(0.4)
    playout.add(0.75, 0.1)  # before 0.8 s: no new underrun
    assert playout.underruns == 1
    playout.add(1.0, 0.1)  # dry from 0.9 s
    assert playout.underruns == 2
    assert playout.stall_s == pytest.approx(0.4 + 0.3)
    assert playout.underruns_per_min == pytest.approx(2 * 60 / 0.4)


def test_empty_packets_play_nothing_and_a_negative_buffer_is_refused() -> None:
    playout = Playout()
    playout.add(0.0, 0.0)
    assert (playout.packets, playout.gap_max_s, playout.underruns_per_min) == (0, None, 0.0)
    with pytest.raises(ValueError, match=r"jitter buffer of -0\.1 s"):
        Playout(buffer_s=-0.1)
