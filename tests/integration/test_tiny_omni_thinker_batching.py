"""The thinker decodes the tokens of concurrent sessions in shared forwards.

As for the talker (``test_tiny_omni_talker_batching``): exactness is pinned with the
model driven directly (sessions of different cache lengths decoded in one padded batch
give the tokens each gives alone, greedy or sampled with its own generator); through
the engine, where timing decides the batches, tests assert structure only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from tiny_omni_ids import (
    PRINTABLE_RANGES,
    Tokens,
)

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.qwen3_omni.conversation import Conversation
from omni_actors.actors.engines.qwen3_omni.hf import DynamicCache
from omni_actors.actors.engines.qwen3_omni.sampling import Sampling
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine
from omni_actors.actors.engines.qwen3_omni.thinker_model import DecodeStep, ThinkerModel
from omni_actors.models import cache as model_cache

pytestmark = pytest.mark.integration

STEPS = 24
INSTRUCTIONS = ["Be brief.", "You are a helpful assistant who answers in full sentences.", "Hi"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("model-cache")
    model_cache.prepare("tiny-omni", cache_dir=cache)
    return cache


def samplings() -> list[Sampling]:
    """Greedy, sampled with a session generator, greedy: one per conversation."""
    greedy = Sampling(STEPS, 0, 0.0, None)
    sampled = Sampling(STEPS, 0, 0.9, torch.Generator().manual_seed(7))
    return [greedy, sampled, greedy]


def decode(model: ThinkerModel, batches: list[list[int]]) -> list[list[int]]:
    """Open a reply in each of three conversations of different lengths, then decode
    ``STEPS`` tokens, the conversations grouped into model calls as ``batches`` says."""
    conversations, tokens = [], []
    for text, sampling in zip(INSTRUCTIONS, samplings(), strict=True):
        conversation = Conversation(DynamicCache(config=model.text_config))
        model.instruct(conversation, model.vocabulary.system_turn(text))
        token, _ = model.open_reply(conversation, None, sampling)
        conversations.append((conversation, sampling))
        tokens.append([token])
    for _ in range(STEPS):
        for batch in batches:
            steps = [
                DecodeStep(conversations[i][0], tokens[i][-1], True, conversations[i][1])
                for i in batch
            ]
            for i, (token, _) in zip(batch, model.decode_steps(steps), strict=True):
                tokens[i].append(token)
    assert len({conversation.position for conversation, _ in conversations}) == 3
    return tokens


def test_a_padded_batch_decodes_each_session_as_alone(cache_dir: Path) -> None:
    """The picks of sessions decoded in one forward == their solo picks, sampled ones
    drawing from their own generators. Exact tokens, though a batch changes float sums
    in the last bits: with the seed-0 weights no pick here is that close to a tie (on
    another CPU that flips one, compare the logits within ~1e-6 instead)."""
    model = ThinkerModel(cache_dir / "tiny-omni" / "seed-0", allowed_token_ranges=PRINTABLE_RANGES)
    alone = decode(model, [[0], [1], [2]])
    together = decode(model, [[0, 1, 2]])
    assert together == alone
    assert len(set(map(tuple, alone))) == 3  # three different replies


# -- through the engine: structure -------------------------------------------------------


@asynccontextmanager
async def thinker(cache_dir: Path, **extra: Any) -> AsyncIterator[ThinkerEngine]:
    args = ThinkerArgs(
        seed=0,
        cache_dir=str(cache_dir),
        min_new_tokens=8,
        allowed_token_ranges=PRINTABLE_RANGES,
        **extra,
    )
    engine = ThinkerEngine(args)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def reply(engine: ThinkerEngine, session: str, text: str) -> list[int]:
    async def inputs() -> AsyncIterator[Fields]:
        yield {"text": text}

    ids = []
    async for out in engine.generate(session, inputs()):
        token = out.get("token_ids")
        if isinstance(token, torch.Tensor):
            ids.append(int(token))
    return ids


@pytest.mark.parametrize("max_batch", [16, 2])
async def test_concurrent_sessions_share_decode_forwards_up_to_max_batch(
    cache_dir: Path, max_batch: int
) -> None:
    texts = [f"request number {i}" for i in range(6)]
    async with thinker(cache_dir, max_batch=max_batch, max_new_tokens=32) as engine:
        replies = await asyncio.wait_for(
            asyncio.gather(*(reply(engine, f"s{i}", t) for i, t in enumerate(texts))), 60.0
        )
        assert engine.generating == set()
        batcher = engine.batcher
    for ids in replies:
        assert 8 <= len(ids) <= 32
        assert Tokens.IM_END not in ids
        assert all(32 <= token < 127 for token in ids)
    # The first token comes from each reply's prefill; each later one, and the
    # <|im_end|> of a reply under the limit, from a decode step.
    assert batcher.requests == sum(len(ids) - (len(ids) == 32) for ids in replies)
    assert 1 < batcher.largest <= max_batch
    assert batcher.calls < 0.75 * batcher.requests  # most forwards were shared


async def test_an_engine_over_the_static_cache_replies_as_without_it(cache_dir: Path) -> None:
    """Through the engine, with a static slot cache (forced on the CPU): two sessions'
    two turns each come out as without it. Two slots of 64 positions: the second turns
    outgrow them and go on over their own caches, after the first replies' decoded
    positions were settled back into them."""
    texts = ["Hi there", "What is new today?"]

    async def turns(**extra: Any) -> list[list[int]]:
        async with thinker(cache_dir, max_batch=2, max_new_tokens=24, **extra) as engine:
            got = []
            for turn in range(2):
                got += await asyncio.wait_for(
                    asyncio.gather(
                        *(reply(engine, f"s{i}", f"{t} ({turn})") for i, t in enumerate(texts))
                    ),
                    60.0,
                )
            static = engine._model.static
            if static is not None:
                assert static.steps > 0
                assert static.fallbacks > 0
        return got

    assert await turns(static_cache=True, max_context=64) == await turns(static_cache=False)
