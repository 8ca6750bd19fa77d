"""The talker rows a user turn hands out: one piece as it is (a view of the step's
output, which keeps that step's mark), several joined by the engine's ``cat``."""

from __future__ import annotations

from typing import cast

import torch

from omni_actors.actors.engines.qwen3_omni.user_turn import Feed, UserTurn
from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary
from omni_actors.cuda.step_ready import mark_step, step_mark

CPU = torch.device("cpu")


def turn() -> UserTurn:
    # Keeping and taking rows reads no vocabulary.
    return UserTurn(cast(Vocabulary, None))


def test_one_piece_goes_as_the_step_made_it_with_its_mark() -> None:
    step_output = torch.randn(6, 4)
    mark = object()
    mark_step(step_output, CPU, lambda: mark)
    user_turn = turn()
    user_turn.keep(Feed([1, 2, 3, 4, 5, 6], skip=1, tail=1), step_output, torch.zeros(6) > 0)

    def refused(parts: list[torch.Tensor]) -> torch.Tensor:
        raise AssertionError("one piece is not joined")

    out = user_turn.take_rows(refused)
    assert out is not None
    user = out["user"]
    assert isinstance(user, torch.Tensor)
    assert torch.equal(user, step_output[1:5])
    assert user.untyped_storage().data_ptr() == step_output.untyped_storage().data_ptr()
    assert step_mark(user) is mark
    assert user_turn.take_rows(refused) is None  # nothing left to send


def test_several_pieces_are_joined_by_the_engines_cat() -> None:
    first, second = torch.randn(3, 4), torch.randn(2, 4)
    user_turn = turn()
    user_turn.keep(Feed([1, 2, 3]), first, torch.tensor([False, True, False]))
    user_turn.keep(Feed([4, 5]), second, torch.tensor([True, False]))
    joined: list[int] = []

    def cat(parts: list[torch.Tensor]) -> torch.Tensor:
        joined.append(len(parts))
        return torch.cat(parts)

    out = user_turn.take_rows(cat)
    assert out is not None
    assert joined == [2, 2]  # the rows, then their mask
    assert torch.equal(cast(torch.Tensor, out["user"]), torch.cat((first, second)))
    mask = cast(torch.Tensor, out["user_mask"])
    assert mask.tolist() == [False, True, False, True, False]
