"""How a thinker response picks its tokens: its limits, greedy or sampled, and its seed.

A response's options (``ResponseOptions``) override the engine's settings for that
response only: ``max_tokens`` replaces ``max_new_tokens`` (the minimum is capped to it),
a ``temperature`` > 0 samples, 0 or none is greedy.

Sampling draws from the softmax of the allowed tokens' logits at that temperature, with
the session's own ``torch.Generator``, seeded from the engine's ``seed`` and the session
key by BLAKE2b (Python's ``hash`` is salted per process): the same pipeline seed and
session key draw the same replies on every run, and no two sessions share a random
stream, so one session's traffic never changes another's samples.

The generator is a CPU one and gives one uniform number per token; the pick is made on
the logits' device by inverse CDF (:func:`draw`): every sampled row of a step in one
pass, read back with the greedy ones in one host read, not a vocabulary's worth of
probabilities copied to the host per session per token. The same uniforms are drawn on
every device; where two devices round a cumulative sum differently, a draw that falls
on the boundary of two tokens may pick the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import NamedTuple

import torch

from omni_actors.actors.engines.contract import ResponseOptions

__all__ = ["Sampling", "draw", "sampling_for", "session_seed"]


class Sampling(NamedTuple):
    """How one response picks its tokens."""

    max_tokens: int
    min_tokens: int
    """``<|im_end|>`` is masked until the reply has that many tokens."""
    temperature: float
    """0: greedy."""
    generator: torch.Generator | None
    """The session's generator when sampling."""


def sampling_for(
    options: ResponseOptions,
    *,
    max_new_tokens: int,
    min_new_tokens: int,
    generator: Callable[[], torch.Generator],
) -> Sampling:
    """The response's sampling: the engine's settings with ``options`` over them.

    Args:
        options: the response's overrides.
        max_new_tokens: the engine's most tokens per reply.
        min_new_tokens: the engine's least tokens per reply.
        generator: the session's generator, asked for only when sampling.

    Raises:
        ValueError: ``max_tokens`` < 1 or ``temperature`` < 0.
    """
    max_tokens = max_new_tokens if options.max_tokens is None else options.max_tokens
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    temperature = options.temperature or 0.0
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    chosen = generator() if temperature > 0 else None
    return Sampling(max_tokens, min(min_new_tokens, max_tokens), temperature, chosen)


def session_seed(seed: int, session: str) -> int:
    """The seed of ``session``'s generator under the engine's ``seed`` (module docstring)."""
    digest = hashlib.blake2b(f"{seed}/{session}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def draw(
    logits: torch.Tensor,
    allowed: torch.Tensor,
    temperatures: torch.Tensor,
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """One token per row of ``logits`` [n, vocab], sampled (module docstring): ``allowed``
    [n, vocab] is 0 where a token may be picked and ``-inf`` elsewhere, ``temperatures``
    [n] > 0, each row drawn with its session's generator. [n] token ids, on the device
    of ``logits``; nothing is read back to the host."""
    probs = torch.softmax((logits.float() + allowed) / temperatures[:, None], dim=-1)
    cdf = probs.cumsum(dim=-1)
    uniform = torch.cat([torch.rand(1, generator=g) for g in generators])
    # u in [0, 1): the first token whose cumulative sum passes u * total has a
    # probability > 0 (right=True skips the disallowed tokens' flat runs).
    target = uniform.to(cdf.device, non_blocking=True) * cdf[:, -1]
    tokens = torch.searchsorted(cdf, target[:, None].contiguous(), right=True)[:, 0]
    return tokens.clamp_(max=logits.shape[-1] - 1)
