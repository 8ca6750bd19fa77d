"""``ConversationLog``: what a conversation keeps to replay, by what each response's end
did to the entry engine, within its bound."""

from __future__ import annotations

import torch

from omni_actors.actors.engines.contract import INSTRUCTIONS_FIELD, REPLY_FIELD
from omni_actors.pipeline.conversation_log import ConversationLog


def replayed(log: ConversationLog) -> list[tuple[str, object]]:
    """(mark, what it carries) per replayed chunk: its text, instructions or reply ids."""
    out: list[tuple[str, object]] = []
    for chunk in log.replay():
        ids = chunk.payload.get(REPLY_FIELD)
        if isinstance(ids, torch.Tensor):
            out.append((chunk.mark, tuple(ids.tolist())))
        elif chunk.mark == "truncate":
            out.append((chunk.mark, chunk.kept))
        else:
            out.append((chunk.mark, dict(chunk.payload)))
    return out


def test_completed_turns_replay_as_sent_then_committed_then_their_reply() -> None:
    log = ConversationLog(1 << 20)
    log.sent(0, {"text": "hi"})
    log.sent(0, {}, end="segment")
    log.answered(0, reply=(7, 8))
    log.sent(1, {}, mark="truncate", kept=1)
    log.sent(1, {"text": "and?"})  # the next turn, still open
    assert replayed(log) == [
        ("", {"text": "hi"}),
        ("commit", {}),
        ("reply", (7, 8)),
        ("truncate", 1),
        ("", {"text": "and?"}),
    ]


def test_a_turn_whose_stage_died_stays_committed_without_a_reply() -> None:
    log = ConversationLog(1 << 20)
    log.sent(0, {"text": "hi"}, end="segment")
    log.answered(0, reply=None)
    assert replayed(log) == [("", {"text": "hi"}), ("commit", {})]


def test_a_rolled_back_response_keeps_its_truncations_and_last_instructions() -> None:
    log = ConversationLog(1 << 20)
    log.sent(0, {"text": "hi"}, end="segment")
    log.answered(0, reply=(7, 8, 9))
    log.sent(1, {}, mark="truncate", kept=2)
    log.sent(1, {INSTRUCTIONS_FIELD: "be brief"})
    log.sent(1, {"text": "fail", INSTRUCTIONS_FIELD: "be kind"})
    log.sent(1, {}, mark="commit")
    log.sent(1, {}, end="segment")
    log.answered(1, reply=None, rolled_back=True)
    assert replayed(log)[3:] == [("truncate", 2), ("", {INSTRUCTIONS_FIELD: "be kind"})]
    assert log.nbytes == len("hi") + 3 * 8 + len("be kind")  # what was let go is not held


def test_past_its_bound_or_when_finishing_it_keeps_nothing_and_says_why() -> None:
    log = ConversationLog(8)
    log.sent(0, {"text": "1234"})
    assert not log.lost
    log.sent(0, {"audio": torch.zeros(2)})  # 8 more bytes: 12 in all
    assert "max_history_bytes (8 bytes)" in log.lost
    assert list(log.replay()) == []
    assert log.nbytes == 0
    finishing = ConversationLog(1 << 20)
    finishing.sent(0, {"text": "bye"}, end="finished")
    assert finishing.lost == "the session was finishing"


def test_an_entry_engine_without_a_conversation_has_nothing_to_replay() -> None:
    log = ConversationLog(1 << 20, records=False)
    log.sent(0, {"text": "hi"}, end="segment")
    log.answered(0, reply=(1,))
    assert not log.lost
    assert list(log.replay()) == []


def test_a_deleted_user_turn_goes_with_its_input_and_keeps_the_instructions_amid_it() -> None:
    log = ConversationLog(1 << 20)
    log.sent(0, {"text": "one"})
    log.sent(0, {}, mark="commit", turn="u1")
    log.sent(0, {"text": "two"})
    log.sent(0, {INSTRUCTIONS_FIELD: "be brief"})
    log.sent(0, {"text": "more"})
    log.sent(0, {}, mark="commit", turn="u2")
    log.sent(0, {}, end="segment")
    log.answered(0, reply=(7,))
    assert not log.delete_turn("nobody")
    assert log.delete_turn("u2")
    assert replayed(log) == [
        ("", {"text": "one"}),
        ("commit", {}),
        ("", {INSTRUCTIONS_FIELD: "be brief"}),
        ("commit", {}),
        ("reply", (7,)),
    ]
    assert log.nbytes == len("one") + len("be brief") + 8
    assert log.delete_turn("u1")
    assert replayed(log)[0] == ("", {INSTRUCTIONS_FIELD: "be brief"})


def test_a_deleted_reply_goes_with_the_truncations_of_it() -> None:
    log = ConversationLog(1 << 20)
    log.sent(0, {"text": "hi"}, end="segment")
    log.answered(0, reply=(7, 8))
    log.sent(1, {}, mark="truncate", kept=1)
    log.sent(1, {"text": "again"}, end="segment")
    log.answered(1, reply=(9,))
    log.sent(2, {}, mark="truncate", kept=0)  # cuts the reply of segment 1: it stays
    assert log.delete_reply(0)
    assert not log.delete_reply(0)
    assert replayed(log) == [
        ("", {"text": "hi"}),
        ("commit", {}),
        ("", {"text": "again"}),
        ("commit", {}),
        ("reply", (9,)),
        ("truncate", 0),
    ]


def test_a_deleted_assistant_turn_given_by_the_caller_goes_alone() -> None:
    log = ConversationLog(1 << 20)
    log.sent(0, {"text": "hi"})
    log.sent(0, {}, mark="commit", turn="u1")
    log.sent(0, {"text": "hello"}, mark="reply", turn="a1")
    log.sent(0, {"tool_calls": "{}"}, mark="reply", turn="a2")
    log.sent(0, {"text": "and?"})
    assert log.delete_turn("a1")
    assert not log.delete_turn("a1")
    assert replayed(log) == [
        ("", {"text": "hi"}),
        ("commit", {}),
        ("reply", {"tool_calls": "{}"}),
        ("", {"text": "and?"}),
    ]
    assert log.nbytes == len("hi") + len("{}") + len("and?")
