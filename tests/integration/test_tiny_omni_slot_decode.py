"""The thinker with its decode rows read in place (``decode_attention="triton"``): every
session's tokens and talker rows are those the gathering thinker gives alone, through
decode graphs, fresh prefill graphs carrying rows, mixed steps and compiled decode
layers. On a GPU, or on a CPU through Triton's interpreter (``TRITON_INTERPRET=1``);
skipped where neither runs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton runs on a GPU or in its interpreter", allow_module_level=True)

from graph_standins import Backend, Captures  # noqa: E402
from test_tiny_omni_thinker_batching import PROMPTS, alone, loop_over, picks, session  # noqa: E402
from tiny_omni_ids import PRINTABLE_RANGES  # noqa: E402

from omni_actors.actors.engines.qwen3_omni.thinker_model import ThinkerModel  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("compiled", [False, True])
async def test_in_place_decode_rows_pick_as_the_gathered_ones(
    cache_dir: Path, compiled: bool
) -> None:
    path = cache_dir / "tiny-omni" / "seed-0"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    common: dict[str, Any] = {
        "allowed_token_ranges": PRINTABLE_RANGES,
        "slots": 8,
        "max_context": 256,
        "device": device,
    }
    want = await alone(ThinkerModel(path, **common, decode_attention="gather"))
    extra: dict[str, Any] = {"compile_layers": Backend()} if compiled else {}
    model = ThinkerModel(
        path,
        **common,
        graphs=True,
        capture=Captures(),
        prefill_graphs=True,
        prefill_bucket=32,
        prefill_rows=4,
        decode_attention="triton",
        **extra,
    )
    assert model.cache.in_place
    for (tokens, _), (want_tokens, _) in zip(await alone(model), want, strict=True):
        assert tokens == want_tokens
    loop = loop_over(model, max_chunk=128, budget=60)
    loop.start()
    pairs = enumerate(zip(PROMPTS, picks(), strict=True))
    together = await asyncio.gather(*(session(loop, f"t{i}", p, pick) for i, (p, pick) in pairs))
    await loop.stop()
    assert loop.statistics().mixed_steps > 0
    assert model.eager_steps == 0
    for (tokens, rows), (want_tokens, want_rows) in zip(together, want, strict=True):
        assert tokens == want_tokens
        torch.testing.assert_close(rows, want_rows, rtol=1e-4, atol=1e-5)
