"""Rollback benchmark: what a ``clear`` or a ``truncate`` costs the next reply.

A thinker that holds a conversation's KV cache between turns answers the next turn
after prefilling only that turn. A rollback breaks that: the torch thinker crops its
cache; the vLLM thinker, whose streaming requests only append, ends the request and
opens a new one over the whole conversation, which vLLM's prefix cache serves except
for the blocks past the cut. This bench builds the same conversation in fresh sessions
and measures the time to the first text token of the next reply after each of:

- ``plain``: a new turn, no rollback;
- ``clear``: a turn that was sent (and prefilled), then cleared, then a new turn;
- ``truncate``: the last reply cut to what was heard of it, then a new turn.

Every reply has ``reply_tokens`` tokens and is drained before the next step, so nothing
else computes while a first token is timed. Kinds are interleaved across repeats, so
drift in the machine's load spreads over all three.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omni_actors.bench.models import fixed_replies
from omni_actors.bench.pipeline import _machine
from omni_actors.bench.stats import percentile
from omni_actors.models.cache import prepare
from omni_actors.pipeline.omni_pipeline import OmniPipeline
from omni_actors.pipeline.response import Response
from omni_actors.pipeline.session import Session
from omni_actors.pipeline.spec.pipeline import load_pipeline
from omni_actors.protocols.events import ResponseDone, TextDelta

__all__ = ["KINDS", "run_rollback_bench"]

KINDS = ("plain", "clear", "truncate")
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while")
_HEARD_MS = 200.0  # what the user heard of the reply before barging in


def _turn_text(turn: int, chars: int) -> str:
    """A deterministic user turn of about ``chars`` characters, distinct per turn."""
    words: list[str] = []
    i = turn
    while sum(len(w) + 1 for w in words) < chars:
        words.append(_WORDS[i % len(_WORDS)])
        i += 3 + turn
    return " ".join(words)[:chars]


def _stats(ms: list[float]) -> dict[str, Any]:
    return {
        "p50": round(percentile(ms, 50), 3),
        "min": round(min(ms), 3),
        "max": round(max(ms), 3),
        "samples": [round(m, 3) for m in ms],
    }


async def _drain(response: Response, started: float) -> float | None:
    """Wait for ``response`` to end; seconds from ``started`` to its first text (None:
    it had none)."""
    first: float | None = None
    async for event in response.events():
        if first is None and isinstance(event, TextDelta) and event.text:
            first = time.perf_counter() - started
        if isinstance(event, ResponseDone) and event.status != "completed":
            raise RuntimeError(f"a bench reply ended {event.status}: {event}")
    return first


async def _build(session: Session, turns: int, chars: int, tokens: int) -> None:
    for turn in range(turns):
        await session.send(text=_turn_text(turn, chars))
        await _drain(await session.respond(max_tokens=tokens), time.perf_counter())


async def _rollback(kind: str, session: Session) -> None:
    if kind == "clear":
        await session.send(text=_turn_text(99, 64))  # prefilled as it arrives
        await session.clear()
    elif kind == "truncate":
        await session.truncate(_HEARD_MS)


async def _sample(omni: OmniPipeline, kind: str, turns: int, chars: int, tokens: int) -> float:
    async with omni.session() as session:
        await _build(session, turns, chars, tokens)
        await _rollback(kind, session)
        await session.send(text=_turn_text(turns, chars))
        started = time.perf_counter()
        first = await _drain(await session.respond(max_tokens=tokens), started)
        if first is None:
            raise RuntimeError("a bench reply had no text")
        return first


async def run_rollback_bench(
    preset: str | Path,
    *,
    turns: int = 6,
    turn_chars: int = 200,
    repeat: int = 5,
    reply_tokens: int = 8,
    cache_dir: Path | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Time to first text token after each kind of rollback (see the module docstring).

    Args:
        preset: a model preset whose thinker takes turn marks (``tiny-omni``,
            ``tiny-omni-vllm``).
        turns: user turns in the conversation before the measured one.
        turn_chars: characters per user turn.
        repeat: sessions per kind.
        reply_tokens: every reply's length.
        cache_dir: the weights cache (prepared first if missing).
        seed: the weights' seed.

    Returns:
        ``ttft_ms`` per kind (p50, min, max, samples), ``vs_plain`` (p50 ratios),
        ``machine`` and ``parameters``.
    """
    if min(turns, turn_chars, repeat, reply_tokens) < 1:
        raise ValueError("turns, turn_chars, repeat and reply_tokens must be >= 1")
    started = time.perf_counter()
    spec = load_pipeline(preset)
    for family in spec.model_families().values():
        prepare(family, cache_dir=cache_dir, seed=seed)
    spec = fixed_replies(spec.with_weights(cache_dir=cache_dir, seed=seed), reply_tokens)
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    async with OmniPipeline(spec, max_sessions=1) as omni:
        await _sample(omni, "plain", 1, turn_chars, reply_tokens)  # warm-up
        for _ in range(repeat):
            for kind in KINDS:
                samples[kind].append(await _sample(omni, kind, turns, turn_chars, reply_tokens))
    ttft = {kind: _stats([x * 1e3 for x in xs]) for kind, xs in samples.items()}
    plain = ttft["plain"]["p50"]
    return {
        "ttft_ms": ttft,
        "vs_plain": {kind: round(ttft[kind]["p50"] / plain, 3) for kind in KINDS[1:]},
        "machine": _machine(),
        "parameters": {
            "preset": str(preset),
            "turns": turns,
            "turn_chars": turn_chars,
            "repeat": repeat,
            "reply_tokens": reply_tokens,
            "seed": seed,
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
