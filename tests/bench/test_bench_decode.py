"""``bench decode`` on tiny-omni on the CPU: the attention threshold it may move for a run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from omni_actors.actors.engines.qwen3_omni import slot_cache, slot_decode, static_decode
from omni_actors.bench.decode import run_decode_bench
from omni_actors.models import cache as model_cache


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("model-cache")
    model_cache.prepare("tiny-omni", cache_dir=cache)
    return cache / "tiny-omni" / "seed-0"


def test_a_run_moves_the_fused_attention_threshold_and_puts_it_back(
    release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    grouped = static_decode.grouped_attention_of

    def spy(*args):  # type: ignore[no-untyped-def]
        seen.append(static_decode.FUSED_MIN_BLOCKS)
        return grouped(*args)

    # The backbone's decode rows (the slot cache's attention) and the code predictor's.
    monkeypatch.setattr(slot_cache, "grouped_attention_of", spy)
    monkeypatch.setattr(static_decode, "grouped_attention_of", spy)
    # Uncompiled: each frame calls the attention (a compiled frame calls it only while
    # traced, and another test may have traced it already).
    common = dict(
        stages={"talker": "cpu"},
        batches=[1],
        context=8,
        steps=2,
        max_context=64,
        talker_compile="off",
    )
    default = static_decode.FUSED_MIN_BLOCKS
    report = run_decode_bench(release, **common, fused_min_blocks=0)  # type: ignore[arg-type]
    assert report["fused_min_blocks"] == 0
    assert seen
    assert set(seen) == {0}
    assert default == static_decode.FUSED_MIN_BLOCKS
    seen.clear()
    report = run_decode_bench(release, **common)  # type: ignore[arg-type]
    assert report["fused_min_blocks"] == default
    assert seen
    assert set(seen) == {default}
    with pytest.raises(ValueError, match="fused_min_blocks"):
        run_decode_bench(release, **common, fused_min_blocks=-1)  # type: ignore[arg-type]
    assert default == static_decode.FUSED_MIN_BLOCKS


def test_the_thinker_reads_rows_in_place_only_where_the_kernel_serves(release: Path) -> None:
    """``decode_attention`` reaches the thinker's slot cache; on a CPU without Triton's
    interpreter the kernel does not serve, and the report says the rows were gathered."""
    common = dict(stages={"thinker": "cpu"}, batches=[2], context=8, steps=2, max_context=64)
    report = run_decode_bench(release, **common, decode_attention="triton")  # type: ignore[arg-type]
    assert report["thinker"]["decode_attention"] == "triton"
    assert report["thinker"]["in_place"] is slot_decode.serves(torch.zeros(1, 2, 1, 32), 4)
    assert report["thinker"]["batches"]["2"]["static_ms"] > 0
    with pytest.raises(ValueError, match="decode_attention"):
        run_decode_bench(release, **common, decode_attention="paged")  # type: ignore[arg-type]
