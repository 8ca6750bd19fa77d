"""``ReplyInput``: the talker's reading of the thinker's user rows and their edits."""

from __future__ import annotations

import pytest
import torch

from omni_actors.actors.engines.qwen3_omni.talker_input import ReplyInput, TalkerInputError
from omni_actors.actors.engines.thinker_ports import USER_EDITS_FIELD


def rows(*values: float) -> dict[str, torch.Tensor | str]:
    """User rows of one column, the value of each, with their mask."""
    user = torch.tensor(values)[:, None]
    return {"user": user, "user_mask": torch.zeros(len(values), dtype=torch.bool)}


def edits(*counts: int) -> dict[str, torch.Tensor | str]:
    return {USER_EDITS_FIELD: torch.tensor(counts, dtype=torch.int64)}


def pending(got: ReplyInput) -> list[float]:
    user, _ = got.take_user()
    return user[:, 0].tolist() if user.numel() else []


def test_rows_without_edits_all_join() -> None:
    got = ReplyInput()
    got.take(rows(1, 2))
    got.take(rows(3))
    assert pending(got) == [1, 2, 3]


def test_edits_take_back_the_rows_not_prefilled_first_then_the_prefilled() -> None:
    got = ReplyInput()
    got.take({**rows(1, 2, 3), **edits(3)})
    assert pending(got) == [1, 2, 3]  # handed to a prefill
    got.take({**rows(4, 5), **edits(2)})
    got.take(edits(-3))  # 5 and 4 were pending; 3 was prefilled
    assert got.take_dropped() == 1
    assert got.take_dropped() == 0
    got.take({**rows(6, 7), **edits(-1, 2)})  # a full edge's merge: in order
    assert got.take_dropped() == 1
    assert pending(got) == [6, 7]


def test_edits_that_miscount_their_rows_are_refused() -> None:
    with pytest.raises(TalkerInputError, match="positive counts must add up"):
        ReplyInput().take({**rows(1, 2), **edits(1)})
    with pytest.raises(TalkerInputError, match="positive counts must add up"):
        ReplyInput().take(edits(2))
    with pytest.raises(TalkerInputError, match="1-D integer tensor"):
        ReplyInput().take({**rows(1), USER_EDITS_FIELD: torch.tensor([1.0])})


def test_taking_back_more_than_the_response_sent_is_refused() -> None:
    got = ReplyInput()
    got.take({**rows(1, 2), **edits(2)})
    with pytest.raises(TalkerInputError, match="take back 3 user rows, but holds 2"):
        got.take(edits(-3))


def test_edits_after_the_first_token_are_refused() -> None:
    got = ReplyInput()
    got.take({"embed": torch.zeros(1, 1)})
    with pytest.raises(TalkerInputError, match="after the reply's first token"):
        got.take(edits(-1))
