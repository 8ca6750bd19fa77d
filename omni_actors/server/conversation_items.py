"""``ConversationItems``: a realtime conversation's items as the server holds them.

The stages hold the conversation itself; the server keeps its items, in order, for what
the Realtime API answers from them: ``conversation.item.retrieve``, each new item's
``previous_item_id``, which ``call_id`` a ``function_call_output`` may answer, and what
``conversation.item.delete`` takes out. The connection decides what goes in and out
(and tells the stages); this is the bookkeeping, kept in one place so that the items,
the replies they came from and the calls in them cannot drift apart:

- an assistant item made by a response names that response (the stages know the reply
  as the response's turn, not as the item);
- a function call the model made belongs to its reply: one assistant turn with its
  message item, so it goes out with that item and cannot be deleted alone;
- the calls the session knows (the model's, and those a client gave back) by
  ``call_id``, with the function each named.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from omni_actors.protocols.realtime_server import (
    ConversationItem,
    ConversationItemAdded,
    ConversationItemDone,
    FunctionCallItem,
    Item,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
    ServerEvent,
)
from omni_actors.server.ids import new_id

__all__ = ["ConversationItems"]


class ConversationItems:
    """The items of one realtime conversation (see the module docstring).

    Attributes:
        last: the id of the conversation's last item (None before the first).
        calls: the tool calls the session knows: ``call_id`` -> the function's name.
    """

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}
        self._replies: dict[str, str] = {}  # assistant item -> its response's id
        self._called: dict[str, str] = {}  # the model's call item -> its reply's message item
        self.last: str | None = None
        self.calls: dict[str, str] = {}

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._items

    def get(self, item_id: str) -> Item | None:
        """The item ``item_id`` as the server holds it, or None."""
        return self._items.get(item_id)

    def add(self, item: Item) -> tuple[str | None, list[ServerEvent]]:
        """Append ``item``: the id of the item before it, and its ``added``/``done``."""
        previous, self.last = self.last, item.id
        self._items[item.id] = item
        return previous, [
            ConversationItemAdded(event_id=new_id("event"), item=item, previous_item_id=previous),
            ConversationItemDone(event_id=new_id("event"), item=item, previous_item_id=previous),
        ]

    def reply_started(self, item_id: str, response_id: str, opening: Iterable[ServerEvent]) -> None:
        """Response ``response_id``'s assistant item ``item_id`` joins the conversation,
        as its ``opening`` events show it."""
        self.last = item_id
        self._replies[item_id] = response_id
        self._hold(opening, ResponseOutputItemAdded)

    def calls_made(self, calls: Iterable[FunctionCallItem], last: str | None) -> None:
        """The model made ``calls`` (completed ones); ``last``, when given, is the
        conversation's last item now (the reply's last call)."""
        for call in calls:
            self.calls.setdefault(call.call_id, call.name)
        if last is not None:
            self.last = last

    def reply_done(
        self, item_id: str, closing: Iterable[ServerEvent], calls: Iterable[FunctionCallItem]
    ) -> None:
        """The reply in ``item_id`` ended: hold it as its ``closing`` events show it, and
        its completed ``calls`` after it, as part of it."""
        if item_id not in self._items:
            return  # deleted meanwhile
        self._hold(closing, ResponseOutputItemDone)
        for call in calls:
            self._items[call.id] = call
            self._called[call.id] = item_id

    def truncated(self, item_id: str, heard: str) -> None:
        """The reply in ``item_id`` was cut: its text is ``heard`` from now on."""
        item = self._items.get(item_id)
        if not isinstance(item, ConversationItem):
            return  # deleted meanwhile
        content = [
            msgspec.structs.replace(part, transcript=heard)
            if part.transcript is not None
            else msgspec.structs.replace(part, text=heard)
            if part.text is not None
            else part
            for part in item.content
        ]
        self._items[item_id] = msgspec.structs.replace(item, content=content)

    def reply_of_call(self, item_id: str) -> str | None:
        """The message item of the reply whose function call ``item_id`` is, or None."""
        return self._called.get(item_id)

    def turn_of(self, item_id: str) -> str:
        """The stages' name for item ``item_id``'s turn: its response for a reply."""
        return self._replies.get(item_id, item_id)

    def oldest_through(self, item_id: str) -> list[str]:
        """The items from the first through ``item_id`` that can go: system items (they
        hold instructions) stay, and a reply's calls go with it, not alone."""
        ids: list[str] = []
        for held, item in self._items.items():
            system = isinstance(item, ConversationItem) and item.role == "system"
            if not system and held not in self._called:
                ids.append(held)
            if held == item_id:
                return ids
        return []

    def remove(self, item_id: str) -> list[str]:
        """Take ``item_id`` out, with the function calls of its reply: the ids gone."""
        del self._items[item_id]
        self._replies.pop(item_id, None)
        gone = [item_id]
        for call, message in list(self._called.items()):
            if message == item_id:
                del self._called[call]
                self._items.pop(call, None)
                gone.append(call)
        if self.last in gone:
            self.last = next(reversed(self._items), None)
        return gone

    def _hold(
        self,
        events: Iterable[ServerEvent],
        kind: type[ResponseOutputItemAdded] | type[ResponseOutputItemDone],
    ) -> None:
        """Keep the response's message item as ``events`` of ``kind`` show it."""
        for event in events:
            if isinstance(event, kind) and isinstance(event.item, ConversationItem):
                self._items[event.item.id] = event.item
