"""``Response``: one reply of a conversation, with its own id and event stream.

``Session.respond`` starts one and returns it. Its events are the session's deltas that
name it, then exactly one ``ResponseDone`` (``completed``, ``cancelled`` or ``failed``);
if the session itself ends first (abort, deadline, a stage crash), the session's
terminal event ends the response's stream instead. A session has one response in flight
at a time, so its events never interleave with another's. The session's events that
belong to no response (the transcripts of the caller's turns) come among them as they
arrive, so that reading a conversation through its responses misses nothing.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from omni_actors.errors import InvalidRequestError
from omni_actors.protocols.events import TERMINAL, TRANSCRIPT_EVENTS, Event, ResponseDone
from omni_actors.protocols.stage import ResponseOptions

if TYPE_CHECKING:
    from omni_actors.pipeline.session import Session

__all__ = ["Response", "checked_options"]


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
        """This response's deltas, then its ``ResponseDone`` (or the terminal event),
        with the session's transcript events (``TranscriptDelta``, ``TranscriptDone``,
        ``TranscriptFailed``: they belong to no response) as they come.

        Events of earlier responses that nobody read are skipped. Read a conversation
        either through its responses or through ``Session.events()``, not both: they
        share one stream.
        """
        while self.done is None:
            event = await self.session.next_event()
            if isinstance(event, TERMINAL):
                self.done = event
            elif isinstance(event, TRANSCRIPT_EVENTS):
                pass  # the caller's turns: the session's, whichever response is read
            elif event.response != self.id:
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

        Once this returns, :meth:`events` yields none of the response's text or audio
        deltas, only its ``ResponseDone(status="cancelled")``, and the session takes the
        next ``respond`` or ``truncate`` at once. Returns False if the response had
        already ended.
        """
        return await self.session.cancel_response(self)


def checked_options(
    max_tokens: int | None,
    temperature: float | None,
    voice: str | None,
    *,
    instructions: str | None = None,
    tools: str | None = None,
) -> ResponseOptions:
    """A response's overrides, checked (``Session.respond``).

    Raises:
        InvalidRequestError: an override is out of range.
    """
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise InvalidRequestError(f"max_tokens must be a positive int, got {max_tokens!r}")
    if temperature is not None and not (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and math.isfinite(temperature)
        and temperature >= 0
    ):
        raise InvalidRequestError(f"temperature must be a number >= 0, got {temperature!r}")
    if voice is not None and (not isinstance(voice, str) or not voice):
        raise InvalidRequestError(f"voice must be a non-empty name, got {voice!r}")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequestError(f"instructions must be a str, got {instructions!r}")
    if tools is not None and not isinstance(tools, str):
        raise InvalidRequestError(f"tools must be a JSON array as text, got {tools!r}")
    return ResponseOptions(
        max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature),
        voice=voice,
        instructions=instructions or None,
        tools=tools if tools and tools != "[]" else None,
    )
