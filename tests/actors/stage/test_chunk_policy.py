"""ChunkPolicy: exactly-once frames, right context, no boundary duplicates."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_actors.actors.stage.chunk_policy import ChunkPolicy, FrameChunk


def _run(
    policy: ChunkPolicy, arrivals: list[int], codebooks: int = 2
) -> tuple[torch.Tensor, list[FrameChunk]]:
    total = sum(arrivals)
    stream = torch.arange(total * codebooks).reshape(total, codebooks)
    window = policy.window()
    chunks: list[FrameChunk] = []
    at = 0
    for n in arrivals:
        chunks += window.push(stream[at : at + n])
        at += n
    chunks += window.finish()
    return stream, chunks


policies = st.builds(
    ChunkPolicy,
    initial_frames=st.integers(1, 8),
    frames=st.integers(1, 30),
    left_context=st.integers(0, 30),
    ramp=st.lists(st.integers(1, 12), max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(policies, st.lists(st.integers(0, 40), max_size=30))
def test_every_frame_exactly_once_with_the_right_context(
    policy: ChunkPolicy, arrivals: list[int]
) -> None:
    stream, chunks = _run(policy, arrivals)
    new = [c.new for c in chunks]
    emitted = torch.cat(new) if new else stream[:0]
    assert torch.equal(emitted, stream)  # no loss, no duplicate
    position = 0
    for i, chunk in enumerate(chunks):
        assert chunk.start == position
        assert chunk.new.shape[0] > 0  # never an empty (re-sent) boundary chunk
        expected_context = min(policy.left_context, position)
        assert chunk.context == expected_context
        assert torch.equal(
            chunk.frames, stream[position - expected_context : position + chunk.new.shape[0]]
        )
        size = chunk.new.shape[0]
        if not chunk.final:
            ramp = (policy.initial_frames, *policy.ramp)
            assert size == (ramp[i] if i < len(ramp) else policy.frames)
        position += size
    assert [c.final for c in chunks].count(True) <= 1
    assert not any(c.final for c in chunks[:-1])


@pytest.mark.parametrize("k", [0, 1, 3])
def test_length_exactly_on_a_boundary_flushes_nothing_extra(k: int) -> None:
    policy = ChunkPolicy(initial_frames=4, frames=25, left_context=25)
    total = 4 + k * 25
    _, chunks = _run(policy, [total])
    assert [c.new.shape[0] for c in chunks] == [4] + [25] * k
    assert not any(c.final for c in chunks)  # nothing pending: finish adds no chunk


def test_defaults_match_qwen3_omni_talker_edge() -> None:
    policy = ChunkPolicy()
    assert (policy.initial_frames, policy.frames, policy.left_context) == (4, 25, 25)
    _, chunks = _run(policy, [1] * 60)
    assert [(c.context, c.new.shape[0]) for c in chunks] == [(0, 4), (4, 25), (25, 25), (25, 6)]
    assert chunks[-1].final


def test_a_ramp_grows_the_chunks_after_the_first_up_to_the_steady_size() -> None:
    policy = ChunkPolicy(initial_frames=4, frames=25, left_context=25, ramp=(8, 16))
    assert [policy.size(n) for n in range(5)] == [4, 8, 16, 25, 25]
    _, chunks = _run(policy, [1] * 60)
    assert [(c.context, c.new.shape[0]) for c in chunks] == [
        (0, 4),
        (4, 8),
        (12, 16),
        (25, 25),
        (25, 7),
    ]
    assert chunks[-1].final


def test_window_memory_stays_bounded() -> None:
    window = ChunkPolicy(initial_frames=2, frames=5, left_context=3).window()
    for _ in range(1000):
        window.push(torch.zeros(7, 4))
    assert window._kept is not None
    assert window._kept.shape[0] <= 3 + 5 + 7


def test_bad_policies_and_misuse_are_errors() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        ChunkPolicy(initial_frames=0)
    with pytest.raises(ValueError, match="left_context"):
        ChunkPolicy(left_context=-1)
    with pytest.raises(ValueError, match=r"ramp=\[8, 0\]"):
        ChunkPolicy(ramp=(8, 0))
    window = ChunkPolicy().window()
    with pytest.raises(ValueError, match="time dimension"):
        window.push(torch.tensor(1.0))
    window.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        window.push(torch.zeros(1, 2))
    assert window.finish() == []


def test_frames_pushed_one_by_one_are_joined_by_the_windows_cat() -> None:
    """A GPU stage joins them with its own concatenation (marked ready, on a stream of
    its own): every join goes through it, and the chunks are the same as torch.cat's."""
    joins: list[int] = []

    def cat(parts: list[torch.Tensor]) -> torch.Tensor:
        joins.append(len(parts))
        return torch.cat(parts)

    policy = ChunkPolicy(initial_frames=4, frames=8, left_context=2)
    window = policy.window(cat)
    stream = torch.arange(24).reshape(12, 2)
    chunks = [c for row in range(12) for c in window.push(stream[row : row + 1])]
    chunks += window.finish()
    assert joins == [4, 9]  # the first chunk's 4 frames; the kept context and 8 more
    plain = policy.window()
    expected = [c for row in range(12) for c in plain.push(stream[row : row + 1])]
    expected += plain.finish()
    assert [(c.frames.tolist(), c.context) for c in chunks] == [
        (c.frames.tolist(), c.context) for c in expected
    ]
