"""What a message type may declare about itself: its reply, and its urgency.

Both are empty mixins (no fields, empty ``__slots__``), so they mix into
``msgspec.Struct`` and dataclasses alike and cost nothing on the wire.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["ControlMessage", "Request"]

R = TypeVar("R", covariant=True)


class Request(Generic[R]):
    """Mixin for a message that is asked, and is answered with an ``R``.

    ``await ref.ask(message)`` is then typed ``R`` (other messages give ``Any``), so the
    reply of every request is declared once, on the request::

        class Inspect(msgspec.Struct, Request[StageState], tag="inspect"): ...

        state = await stage.ask(Inspect())  # a StageState
    """

    __slots__ = ()


class ControlMessage:
    """Mixin marking a message as urgent: it overtakes the actor's queued messages.

    As with Akka's control-aware mailboxes, a message whose type subclasses this one
    travels in the mailbox's system lane, so it is handled before every queued user
    message and is never refused for lack of room (no backpressure wait, no overflow
    policy, no credit across processes): "abort this request" must not queue behind the
    very work it cancels. Otherwise it is an ordinary message: the actor must list its
    type, ``receive`` handles it, an ``ask`` gets the reply, and a failure is supervised
    as usual. While the actor restarts it is stashed ahead of the user messages.

    Keep such messages rare and small, since nothing bounds them::

        class Abort(msgspec.Struct, ControlMessage, tag=True):
            request_id: str
    """

    __slots__ = ()
