"""``Response``: one reply of a conversation, with its own id and event stream.

``Session.respond`` starts one and returns it. Its events are the session's deltas that
name it, then exactly one ``ResponseDone`` (``completed``, ``cancelled`` or ``failed``);
if the session itself ends first (abort, deadline, a stage crash), the session's
terminal event ends the response's stream instead. A session has one response in flight
at a time, so its events never interleave with another's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from omni_actors.protocols.events import TERMINAL, Event, ResponseDone

if TYPE_CHECKING:
    from omni_actors.serving.session import Session

__all__ = ["Response"]


class Response:
    """A reply in flight or done (see the module docstring).

    Attributes:
        id: the response's id (in its events' ``response`` field).
        segment: the session's segment it answers.
        done: its ``ResponseDone`` or the session's terminal event, once read.
    """

    def __init__(self, session: Session, response_id: str, segment: int) -> None:
        self.session = session
        self.id = response_id
        self.segment = segment
        self.done: Event | None = None

    async def events(self) -> AsyncIterator[Event]:
        """This response's deltas, then its ``ResponseDone`` (or the terminal event).

        Events of earlier responses that nobody read are skipped. Read a conversation
        either through its responses or through ``Session.events()``, not both: they
        share one stream.
        """
        while self.done is None:
            event = await self.session.next_event()
            if isinstance(event, TERMINAL):
                self.done = event
                self.session._drained = True
            elif getattr(event, "response", None) != self.id:
                continue  # left over from an earlier response
            elif isinstance(event, ResponseDone):
                self.done = event
            yield event

    async def wait(self) -> Event:
        """Read the rest of the response; its ``ResponseDone`` or the terminal event."""
        async for _ in self.events():
            pass
        assert self.done is not None
        return self.done

    async def cancel(self) -> bool:
        """Stop the reply on every stage (barge-in); the session stays open.

        The response's stream ends with ``ResponseDone(status="cancelled")``, its late
        deltas dropped. Returns False if the response had already ended.
        """
        return await self.session._cancel(self.segment)
