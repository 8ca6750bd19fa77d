"""``sampling.draw``: every sampled row of a step picked on the device, each with its
session's generator."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from omni_actors.actors.engines.qwen3_omni.sampling import draw  # noqa: E402

VOCAB = 6
NEG = float("-inf")


def generators(*seeds: int) -> list[torch.Generator | None]:
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def test_draws_follow_the_softmax_at_the_temperature() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.5, -1.0, 0.0]])
    allowed = torch.zeros(1, VOCAB)
    for temperature in (0.5, 1.0, 2.0):
        gen = generators(11)
        counts = torch.zeros(VOCAB)
        n = 4000
        for _ in range(n):
            token = draw(logits, allowed, torch.tensor([temperature]), gen)
            counts[int(token)] += 1
        want = torch.softmax(logits[0] / temperature, dim=-1)
        # Four standard deviations of a binomial count: a fixed seed, so no flakes.
        for got, p in zip(counts.tolist(), want.tolist(), strict=True):
            assert abs(got - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1


def test_disallowed_tokens_are_never_drawn_at_the_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flat runs of disallowed tokens at the start, in the middle and at the end, and a
    uniform of exactly 0: only allowed tokens come out."""
    logits = torch.zeros(1, VOCAB)
    allowed = torch.tensor([[NEG, NEG, 0.0, NEG, 0.0, NEG]])
    seen = {int(draw(logits, allowed, torch.tensor([1.0]), generators(s))) for s in range(300)}
    assert seen == {2, 4}
    # No seed is known to give a uniform of exactly 0: the draw's ``torch.rand`` does.
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: torch.zeros(1))
    assert int(draw(logits, allowed, torch.tensor([1.0]), generators(0))) == 2


def test_each_row_draws_with_its_own_generator() -> None:
    """A row's draw depends on its generator alone: the same row drawn beside others, or
    alone, picks the same token; the same seed picks the same sequence."""
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    allowed = torch.zeros(3, VOCAB)
    temperatures = torch.tensor([1.0, 0.7, 1.5])

    def run(rows: list[int], seeds: list[int], steps: int = 20) -> list[list[int]]:
        gens = generators(*seeds)
        out: list[list[int]] = [[] for _ in rows]
        for _ in range(steps):
            picked = draw(logits[rows], allowed[rows], temperatures[rows], gens)
            for n, token in enumerate(picked.tolist()):
                out[n].append(token)
        return out

    together = run([0, 1, 2], [1, 2, 3])
    assert run([1], [2]) == [together[1]]
    assert run([0, 2], [1, 3]) == [together[0], together[2]]
    assert run([0, 1, 2], [1, 2, 3]) == together
    assert run([0], [9]) != [together[0]]
