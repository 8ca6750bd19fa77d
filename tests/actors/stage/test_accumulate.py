"""Accumulate rules and chunk sequence checks."""

from __future__ import annotations

import pytest
import torch

from omni_actors.actors.stage.accumulate import Accumulator, ChunkGapError, ChunkSequence


def test_concat_is_the_default_and_replace_keeps_the_latest() -> None:
    acc = Accumulator({"speaker": "replace"})
    acc.add({"token_ids": torch.tensor([1, 2]), "speaker": torch.ones(4), "text": "Hel"})
    acc.add({"token_ids": torch.tensor([3]), "speaker": torch.zeros(4), "text": "lo"})
    acc.add({"hidden": torch.ones(1, 8)})
    acc.add({"hidden": torch.zeros(2, 8)})
    assert torch.equal(acc.get("token_ids"), torch.tensor([1, 2, 3]))
    assert torch.equal(acc.get("speaker"), torch.zeros(4))
    assert acc.get("text") == "Hello"
    assert acc.get("hidden").shape == (3, 8)
    assert acc.get("missing") is None
    assert set(acc.snapshot()) == {"token_ids", "speaker", "text", "hidden"}
    acc.clear()
    assert acc.snapshot() == {}


def test_many_small_chunks_are_joined_once() -> None:
    acc = Accumulator()
    for i in range(1000):
        acc.add({"codes": torch.full((1, 16), i)})
    codes = acc.get("codes")
    assert codes.shape == (1000, 16)
    assert acc.get("codes") is codes  # joined once, then cached


def test_rule_and_type_errors() -> None:
    with pytest.raises(ValueError, match="'concat' or 'replace'"):
        Accumulator({"x": "sum"})  # type: ignore[dict-item]
    acc = Accumulator()
    acc.add({"x": torch.ones(1)})
    with pytest.raises(TypeError, match="cannot concat str onto Tensor"):
        acc.add({"x": "text"})


def test_sequence_drops_duplicates_and_rejects_gaps() -> None:
    seq = ChunkSequence("s1/thinker->talker")
    assert seq.accept(0)
    assert seq.accept(1)
    assert not seq.accept(1)  # duplicate: dropped
    assert not seq.accept(0)
    with pytest.raises(ChunkGapError, match="expected chunk 2, got 4") as info:
        seq.accept(4)
    assert (info.value.expected, info.value.got) == (2, 4)
    assert seq.accept(2)
