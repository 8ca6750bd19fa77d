"""tiny-omni's thinker and talker engines give the same tokens and codes with the lean
experts forward (``moe: lean``, the default) as with transformers' (``moe:
transformers``); the forward itself against transformers': ``tests/actors/engines/test_moe.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from thinker_driving import started
from tiny_omni_ids import PRINTABLE_RANGES, TINY_TALKER

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.engines.qwen3_omni.moe import LeanExperts
from omni_actors.actors.engines.qwen3_omni.talker_engine import TalkerArgs, TalkerEngine
from omni_actors.actors.engines.qwen3_omni.thinker_engine import ThinkerArgs, ThinkerEngine

pytestmark = pytest.mark.integration

TEXT = "Hello there, how are you today?"
TALKER_FIELDS = tuple(TalkerEngine.inputs)


async def feed(items: Iterable[Fields]) -> AsyncIterator[Fields]:
    for item in items:
        yield item


def lean_modules(model: torch.nn.Module) -> int:
    return sum(isinstance(m, LeanExperts) for m in model.modules())


async def thinker_reply(cache_dir: Path, moe: str) -> tuple[list[Fields], int]:
    """The thinker's outputs for ``TEXT`` and how many experts modules ran lean."""
    args = ThinkerArgs(
        seed=0,
        cache_dir=str(cache_dir),
        min_new_tokens=16,
        max_new_tokens=16,
        allowed_token_ranges=PRINTABLE_RANGES,
        moe=moe,  # type: ignore[arg-type]
    )
    async with started(ThinkerEngine(args)) as engine:
        outputs = [o async for o in engine.generate("s", feed([{"text": TEXT}]))]
        return outputs, lean_modules(engine._model._thinker)


async def talker_codes(cache_dir: Path, moe: str, said: list[Fields]) -> tuple[torch.Tensor, int]:
    """The talker's codes for the thinker's outputs ``said`` and how many experts modules
    ran lean."""
    extra: dict[str, Any] = {**TINY_TALKER, "moe": moe}
    args = TalkerArgs(seed=0, cache_dir=str(cache_dir), **extra)
    chunks = [{k: v for k, v in o.items() if k in TALKER_FIELDS} for o in said]
    async with started(TalkerEngine(args)) as engine:
        outputs = [o async for o in engine.generate("s", feed(chunks))]
        lean = lean_modules(engine._model.talker)
    return torch.cat([o["codes"] for o in outputs if isinstance(o["codes"], torch.Tensor)]), lean


def token_ids(outputs: list[Fields]) -> list[int]:
    return [int(o["token_ids"]) for o in outputs if isinstance(o.get("token_ids"), torch.Tensor)]


async def test_the_thinker_and_talker_say_the_same_with_lean_experts(cache_dir: Path) -> None:
    said, lean = await thinker_reply(cache_dir, "lean")
    said_hf, none = await thinker_reply(cache_dir, "transformers")
    assert lean > 0
    assert none == 0
    assert len(token_ids(said)) == 16
    assert token_ids(said) == token_ids(said_hf)
    rows = [o["user"] for o in said if "user" in o]
    rows_hf = [o["user"] for o in said_hf if "user" in o]
    assert len(rows) == len(rows_hf) > 0
    for ours, theirs in zip(rows, rows_hf, strict=True):
        assert isinstance(ours, torch.Tensor)
        assert isinstance(theirs, torch.Tensor)
        # bfloat16 weights: equal to the rounding of a sum taken in another order.
        torch.testing.assert_close(ours, theirs, rtol=1.6e-2, atol=2e-2)
    codes, lean = await talker_codes(cache_dir, "lean", said)
    codes_hf, none = await talker_codes(cache_dir, "transformers", said)
    assert lean > 0
    assert none == 0
    assert codes.shape[0] == 2 * 16
    assert torch.equal(codes, codes_hf)
