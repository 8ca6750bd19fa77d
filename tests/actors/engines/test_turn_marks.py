"""The turn-mark checks every conversation engine shares: their results and messages."""

from __future__ import annotations

import pytest
import torch

from omni_actors.actors.engines.contract import KEPT_FIELD, TURN_FIELD
from omni_actors.actors.engines.turn_marks import TurnMarkError, check_truncatable, kept_of
from omni_actors.errors import EngineError


def test_kept_of_reads_a_one_element_count() -> None:
    assert kept_of({TURN_FIELD: "truncate", KEPT_FIELD: torch.tensor(7)}) == 7
    assert kept_of({TURN_FIELD: "truncate", KEPT_FIELD: torch.tensor([0])}) == 0


@pytest.mark.parametrize(
    "kept",
    [None, "3", torch.tensor([1, 2]), torch.tensor([], dtype=torch.long)],
    ids=["missing", "text", "two-counts", "empty"],
)
def test_kept_of_refuses_a_mark_without_one_count(kept: torch.Tensor | str | None) -> None:
    fields = {TURN_FIELD: "truncate"} | ({} if kept is None else {KEPT_FIELD: kept})
    with pytest.raises(TurnMarkError, match=r"a truncate mark needs 'kept': a 0-d tensor"):
        kept_of(fields)


def test_a_reply_with_nothing_after_it_may_be_cut() -> None:
    reply = object()
    assert check_truncatable(reply, committed_after=False, kept=0) is reply
    assert check_truncatable(reply, committed_after=False, kept=5) is reply


def test_no_reply_to_truncate() -> None:
    with pytest.raises(TurnMarkError, match=r"^the session has no reply to truncate$"):
        check_truncatable(None, committed_after=False, kept=1)


def test_a_user_turn_after_the_reply_must_come_after_the_truncation() -> None:
    with pytest.raises(
        TurnMarkError,
        match=(
            r"^a user turn was committed after the last reply: truncate the reply "
            r"before committing new input$"
        ),
    ):
        check_truncatable(object(), committed_after=True, kept=1)


def test_kept_must_not_be_negative() -> None:
    with pytest.raises(TurnMarkError, match=r"^kept must be >= 0, got -1$"):
        check_truncatable(object(), committed_after=False, kept=-1)


def test_the_error_is_a_value_error_an_engine_can_retype() -> None:
    # The stage answers a refused truncate for a ValueError (it never crashes on one),
    # and the session reports an engine's failure with the engine_error code.
    assert issubclass(TurnMarkError, ValueError)
    assert issubclass(TurnMarkError, EngineError)
    assert TurnMarkError.code == "engine_error"
