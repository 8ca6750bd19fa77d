"""The realtime conversation's items as the server holds them: order, replies and the
calls in them, deletion."""

from __future__ import annotations

from omni_actors.protocols.realtime_server import (
    ConversationItem,
    FunctionCallItem,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
)
from omni_actors.server.conversation_items import ConversationItems


def _message(item_id: str, role: str = "user") -> ConversationItem:
    return ConversationItem(id=item_id, role=role, status="completed", content=[])  # type: ignore[arg-type]


def _call(item_id: str, call_id: str) -> FunctionCallItem:
    return FunctionCallItem(
        id=item_id, call_id=call_id, name="get_weather", arguments="{}", status="completed"
    )


def test_a_reply_holds_its_calls_and_takes_them_out_with_it() -> None:
    items = ConversationItems()
    previous, events = items.add(_message("u1"))
    assert previous is None
    assert [type(e).__name__ for e in events] == ["ConversationItemAdded", "ConversationItemDone"]
    reply = _message("a1", "assistant")
    opened = ResponseOutputItemAdded(event_id="e", response_id="r1", output_index=0, item=reply)
    items.reply_started("a1", "r1", [opened])
    assert (items.last, items.turn_of("a1"), items.turn_of("u1")) == ("a1", "r1", "u1")
    call = _call("c1", "call_1")
    items.calls_made([call], last="c1")
    closed = ResponseOutputItemDone(event_id="e", response_id="r1", output_index=0, item=reply)
    items.reply_done("a1", [closed], [call])
    assert (items.get("c1"), items.reply_of_call("c1"), items.calls) == (
        call,
        "a1",
        {"call_1": "get_weather"},
    )
    assert items.last == "c1"
    assert items.remove("a1") == ["a1", "c1"]
    assert "c1" not in items
    assert items.last == "u1"  # the last item left
    assert items.add(_message("u2"))[0] == "u1"


def test_a_reply_deleted_before_it_ended_is_not_held_again() -> None:
    items = ConversationItems()
    reply = _message("a1", "assistant")
    opened = ResponseOutputItemAdded(event_id="e", response_id="r1", output_index=0, item=reply)
    items.reply_started("a1", "r1", [opened])
    items.remove("a1")
    closed = ResponseOutputItemDone(event_id="e", response_id="r1", output_index=0, item=reply)
    items.reply_done("a1", [closed], [_call("c1", "call_1")])
    assert ("a1" in items, "c1" in items, items.last) == (False, False, None)
