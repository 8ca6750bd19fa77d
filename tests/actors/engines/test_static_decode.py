"""The static slot cache's rules, on a small Qwen3-style text model built here: buckets,
what fits, and steps whose results equal the model's own one-session forwards while
sessions join, leave, move down and are evicted."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from test_graphs import Captures  # the stand-in graphs, beside this module
from transformers import Qwen3Config, Qwen3Model

from omni_actors.actors.engines.qwen3_omni.hf import DynamicCache
from omni_actors.actors.engines.qwen3_omni.static_decode import (
    SPAN_FLOOR,
    StaticDecodeArgs,
    StaticDecoder,
    StaticPlan,
    StepCache,
    batch_bucket,
    span_bucket,
)


def test_batch_buckets_are_powers_of_two_capped_at_the_slots() -> None:
    assert [batch_bucket(n, 32) for n in (1, 2, 3, 5, 8, 9, 17, 32)] == [1, 2, 4, 8, 8, 16, 32, 32]
    assert batch_bucket(5, 6) == 6
    for bad in (0, 33):
        with pytest.raises(ValueError, match=r"1\.\.32"):
            batch_bucket(bad, 32)


def test_span_buckets_double_from_the_floor_up_to_max_len() -> None:
    assert span_bucket(1, 4096) == SPAN_FLOOR
    assert span_bucket(SPAN_FLOOR + 1, 4096) == 2 * SPAN_FLOOR
    assert span_bucket(3000, 3072) == 3072
    assert span_bucket(10, 100) == 100
    with pytest.raises(ValueError, match=r"1\.\.100"):
        span_bucket(101, 100)


def test_a_plan_is_on_for_cuda_by_default_and_graphs_only_there() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 1)
    assert StaticPlan.of(StaticDecodeArgs(), cpu, 8) is None
    assert StaticPlan.of(StaticDecodeArgs(), cuda, 8) == StaticPlan(8, 4096, True, warm=True)
    cold = StaticDecodeArgs(warm_graphs=False)
    assert StaticPlan.of(cold, cuda, 8) == StaticPlan(8, 4096, graphs=True, warm=False)
    forced = StaticDecodeArgs(static_cache=True, max_context=64)
    assert StaticPlan.of(forced, cpu, 2) == StaticPlan(2, 64, graphs=False)
    assert StaticPlan.of(StaticDecodeArgs(static_cache=False), cuda, 8) is None


def small_model() -> Qwen3Model:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    return Qwen3Model(config).eval()


def decoder(model: Qwen3Model, slots: int, max_len: int, capture: Any = None) -> StaticDecoder:
    def step(cache: StepCache, positions: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor]:
        out = model(
            input_ids=ids,
            attention_mask=cache.mask,
            position_ids=positions[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        return (out.last_hidden_state[:, -1],)

    return StaticDecoder(
        model,
        model.config,
        step,
        slots=slots,
        max_len=max_len,
        device=torch.device("cpu"),
        dtype=torch.float32,
        graphs=capture is not None,
        name="test",
        capture=capture,
    )


class Session:
    """A session's cache, its length, and a reference cache stepped alone by HF."""

    def __init__(self, model: Qwen3Model, prompt: list[int]) -> None:
        self.cache = DynamicCache(config=model.config)
        self.alone = DynamicCache(config=model.config)
        for cache in (self.cache, self.alone):
            model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
        self.length = len(prompt)

    def step_alone(self, model: Qwen3Model, token: torch.Tensor) -> torch.Tensor:
        """HF's own step of ``token`` [1] at the session's length, on the reference
        cache: the last hidden state [1, H]."""
        out = model(
            input_ids=token[None],
            past_key_values=self.alone,
            position_ids=torch.tensor([[self.length]]),
            use_cache=True,
        )
        return out.last_hidden_state[:, -1]


@torch.no_grad()
def test_steps_equal_each_session_alone_as_batches_change() -> None:
    model = small_model()
    static = decoder(model, slots=4, max_len=64)
    sessions = [Session(model, list(range(3, 3 + 4 * (n + 1)))) for n in range(5)]
    rounds = [[0], [0, 1, 2], [2], [0, 3], [4, 3, 2, 1], [1], [0, 1, 2, 3]] * 2
    for number, group in enumerate(rounds):
        ids = torch.tensor([[(number * 7 + i) % 64] for i in group])
        (got,) = static.run(
            [sessions[i].cache for i in group], [sessions[i].length for i in group], [ids]
        )
        for row, i in enumerate(group):
            session = sessions[i]
            torch.testing.assert_close(got[row : row + 1], session.step_alone(model, ids[row]))
            session.length += 1
    assert static.evictions > 0  # row 0 changed hands
    # Settled, each session's own cache holds what it decoded, as stepped alone.
    for session in sessions:
        static.settle(session.cache)
        assert not static.leased(session.cache)
        for mine, theirs in zip(session.cache.layers, session.alone.layers, strict=True):
            torch.testing.assert_close(mine.keys, theirs.keys)
            torch.testing.assert_close(mine.values, theirs.values)


@torch.no_grad()
def test_what_does_not_fit_is_refused_and_a_stale_slot_is_caught() -> None:
    model = small_model()
    static = decoder(model, slots=2, max_len=16)
    a, b, c = (Session(model, [1, 2, 3]) for _ in range(3))
    assert not static.fits([3, 3, 3])  # more sessions than slots
    assert not static.fits([16])  # no room for the step's position
    assert static.fallbacks == 2
    ids = torch.tensor([[5]])
    with pytest.raises(ValueError, match="cannot step"):
        static.run([a.cache, b.cache, c.cache], [3, 3, 3], [torch.tensor([[5], [5], [5]])])
    with pytest.raises(ValueError, match="twice"):
        static.run([a.cache, a.cache], [3, 3], [torch.tensor([[5], [5]])])
    with pytest.raises(RuntimeError, match="another length"):
        static.run([a.cache], [4], [ids])  # its cache holds 3
    static.run([a.cache], [3], [ids])
    with pytest.raises(RuntimeError, match="slot holds 4"):
        static.run([a.cache], [3], [ids])  # stepped at 3 again: not what its slot holds
    static.drop(a.cache)
    assert not static.leased(a.cache)
    assert a.cache.get_seq_length() == 3  # dropped: what the slot decoded is gone


@torch.no_grad()
def test_warm_captures_every_bucket_and_span_before_any_step() -> None:
    """At load every (batch bucket, span) is captured, so serving never captures; the
    stand-in graphs (``test_graphs``) replay the steps, whose results stay exact."""
    model = small_model()
    captures = Captures()
    static = decoder(model, slots=4, max_len=600, capture=captures)
    assert static.keys() == [(b, s) for b in (1, 2, 4) for s in (256, 512, 600)]
    assert static.warm([((1,), torch.long)]) == static.keys()
    assert len(captures.graphs) == 9
    sessions = [Session(model, [1, 2, 3, 4]), Session(model, [5, 6])]
    ids = torch.tensor([[7], [8]])
    # Rows of another dtype than warmed are cast into the captured step's buffers.
    given = ids.to(torch.int32)
    (got,) = static.run([s.cache for s in sessions], [s.length for s in sessions], [given])
    assert len(captures.graphs) == 9  # replayed, not captured again
    assert sum(graph.replays for graph in captures.graphs) == 10  # 9 checks + this step
    for row, session in enumerate(sessions):
        torch.testing.assert_close(got[row : row + 1], session.step_alone(model, ids[row]))
    with pytest.raises(RuntimeError, match="before any session steps"):
        static.warm([((1,), torch.long)])
