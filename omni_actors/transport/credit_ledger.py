"""``CreditLedger``: the receiving side of credit-based flow control.

For each flow — one sending node, one target actor here — the receiver grants a window
of messages when the flow opens (the target's mailbox room, or its capacity for the
process actor's own flow) and one more each time the target has handled a message. A
``Credit`` frame carries the *limit* this adds up to (window + messages handled), not an
increment, so a replayed or duplicated ``Credit`` repeats a limit the sender already
has and cannot let it exceed the receiver's room. Grants go out in batches of a quarter
window: holding back less than that never starves the sender (it still holds the other
three quarters) and saves a frame per message.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CreditLedger"]


@dataclass(slots=True)
class _Flow:
    window: int
    handled: int = 0
    reported: int = 0  # ``handled`` when the last ``Credit`` went out


class CreditLedger:
    """What each flow into this node has been allowed to send."""

    __slots__ = ("_flows",)

    def __init__(self) -> None:
        self._flows: dict[tuple[int, str], _Flow] = {}

    def open(self, peer: int, target: str, room: int) -> int:
        """The limit to grant for an ``OpenFlow``: ``room`` for a new flow.

        A flow already open (the same ``OpenFlow`` again) keeps its window: answering
        with its current limit grants nothing new.
        """
        flow = self._flows.get((peer, target))
        if flow is None:
            flow = self._flows[(peer, target)] = _Flow(max(1, room))
        flow.reported = flow.handled
        return flow.window + flow.handled

    def handled(self, peer: int, target: str, capacity: int) -> int | None:
        """``target`` handled one message from ``peer``: the limit to send now, or None.

        A flow never opened here is the process actor's own, whose window is its
        mailbox ``capacity`` (what the worker announced in ``ActorStarted``).
        """
        key = (peer, target)
        flow = self._flows.get(key)
        if flow is None:
            flow = self._flows[key] = _Flow(max(1, capacity))
        flow.handled += 1
        if flow.handled - flow.reported < max(1, capacity // 4):
            return None
        flow.reported = flow.handled
        return flow.window + flow.handled

    def close(self, peer: int, target: str) -> None:
        """Forget one flow (its target is gone: a new one starts from zero)."""
        self._flows.pop((peer, target), None)

    def forget_peer(self, peer: int) -> None:
        """Forget every flow from ``peer`` (it died or left)."""
        for key in [k for k in self._flows if k[0] == peer]:
            del self._flows[key]
