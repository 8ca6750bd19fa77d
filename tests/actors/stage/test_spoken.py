"""SpokenOutputs: an entry engine's tool-call outputs never reach the stages after it."""

from __future__ import annotations

import torch

from omni_actors.actors.engines.contract import Fields
from omni_actors.actors.stage.spoken import SpokenOutputs


def _out(k: int, text: str) -> Fields:
    return {"token_ids": torch.tensor([k]), "text": text}


def _voiced(deltas: list[str], kept: tuple[str, ...] = ()) -> list[Fields]:
    spoken = SpokenOutputs(kept)
    sent = [o for k, d in enumerate(deltas) for o in spoken.feed(_out(k, d))]
    return sent + spoken.flush()


def _ids(outputs: list[Fields]) -> list[int]:
    return [int(o["token_ids"][0]) for o in outputs if "token_ids" in o]  # type: ignore[index]


def test_outputs_in_a_call_are_not_sent_on() -> None:
    deltas = ["Sure", ".", " <tool_call>", '{"name":', ' "f"}', "</tool_call>", " Bye"]
    assert _ids(_voiced(deltas)) == [0, 1, 6]  # " <tool_call>" says nothing but a blank


def test_a_marker_split_over_outputs_is_held_until_known() -> None:
    spoken = SpokenOutputs(())
    assert _ids(spoken.feed(_out(0, "Hi"))) == [0]
    assert spoken.feed(_out(1, " <")) == []  # may open a call
    assert spoken.feed(_out(2, "tool_")) == []
    assert _ids(spoken.feed(_out(3, "box"))) == [1, 2, 3]  # it did not
    assert spoken.feed(_out(4, "<tool_")) == []
    assert spoken.feed(_out(5, "call>")) == []  # it did: 4 and 5 are the call's
    assert _ids(spoken.feed(_out(6, "{}</tool_call>"))) == []
    assert _ids(spoken.flush()) == []


def test_what_an_output_sets_goes_on_without_its_token() -> None:
    spoken = SpokenOutputs(("opening",))
    first = {**_out(0, "<tool_call>"), "opening": torch.zeros(3, 2)}
    assert [sorted(o) for o in spoken.feed(first)] == [["opening"]]


def test_held_text_that_never_became_a_marker_goes_on_at_the_end() -> None:
    assert _ids(_voiced(["Hi", " <tool"])) == [0, 1]
