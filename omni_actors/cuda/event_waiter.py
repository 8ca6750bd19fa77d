"""``EventWaiter``: asyncio futures that resolve when CUDA events complete.

An asynchronous device-to-host copy is done when the event recorded after it completes.
Waiting for that on the event loop would block it (``event.synchronize()``) or poll it
(``event.query()`` on a timer). Instead one thread, owned by the waiter, synchronizes
the events in the order they were handed over and wakes the loop once per event with
``call_soon_threadsafe``: the loop does nothing until the copy is done.

Done already. An event that has completed by the time it is handed over, with no
earlier one still pending, resolves its future at once, without the thread: at decode
sizes a copy is usually complete by the time the loop looks (it ran behind the forward,
while the step waited for its sampled token), and the round trip through the thread
would cost two interpreter hand-overs at the moment the next step is launching.

Order. Events are waited for one after another, in submission order. A stage's copies
run on one copy stream, so they complete in that order too and none waits behind a
later one; events of several streams would wait in submission order.

Ownership. The thread starts with the first event and ends at :meth:`EventWaiter.close`,
which fails the futures still pending with :class:`EventWaiterClosedError`. An event
that fails (a CUDA error) fails its own future, not the waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from typing import Protocol

from omni_actors.errors import OmniError

__all__ = ["Completable", "EventWaiter", "EventWaiterClosedError"]

log = logging.getLogger(__name__)


class Completable(Protocol):
    """What the waiter waits on: ``torch.cuda.Event`` is one."""

    def synchronize(self) -> None:
        """Block until the work recorded before it has completed."""

    def query(self) -> bool:
        """Whether that work has completed, without blocking."""


class EventWaiterClosedError(OmniError):
    """The waiter was closed before the event was waited for."""


_Item = tuple[Completable, asyncio.Future[None], asyncio.AbstractEventLoop]


class EventWaiter:
    """Resolves a future per event from a thread of its own; see the module docstring.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str = "omni-actors event waiter") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pending: set[asyncio.Future[None]] = set()
        self._closed = False

    @property
    def pending(self) -> int:
        """Events handed over whose futures have not resolved yet."""
        return len(self._pending)

    def wait(self, event: Completable) -> asyncio.Future[None]:
        """A future that resolves once ``event`` has completed (in the running loop).

        Raises:
            EventWaiterClosedError: the waiter is closed.
        """
        if self._closed:
            raise EventWaiterClosedError("the event waiter is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if not self._pending and _completed(event):
            future.set_result(None)  # nothing earlier to keep order with: no thread trip
            return future
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put((event, future, loop))
        return future

    async def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after the event it waits on; pending futures fail.

        Waits up to ``timeout`` seconds for the thread (an event on a hung device never
        completes: the thread is a daemon and is left to the process's end).
        """
        if self._closed:
            return
        self._closed = True
        for future in list(self._pending):
            if not future.done():
                future.set_exception(EventWaiterClosedError("the event waiter was closed"))
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(thread.join, timeout)
            if thread.is_alive():
                log.warning("%s still waits on an event after %.1fs", self._name, timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            event, future, loop = item
            error: BaseException | None = None
            try:
                event.synchronize()
            except Exception as exc:  # a CUDA error belongs to this event's future
                error = exc
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, error)


def _completed(event: Completable) -> bool:
    """Whether ``event`` is known to be complete; an error is left to the thread's
    ``synchronize``, which reports it on the event's own future."""
    try:
        return event.query()
    except Exception:
        return False


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # cancelled by its caller, or failed by close()
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
