"""CUDA awareness: device tensors leave and enter a stage without stalling its steps.

A stage that produces tensors on a GPU copies them to host memory on a stream of its
own, and the message leaves once that copy's event has completed; the event loop never
blocks and never polls meanwhile (:class:`EventWaiter`). Without CUDA the same calls
complete at once.
"""

from omni_actors.cuda.event_waiter import Completable, EventWaiter, EventWaiterClosedError

__all__ = ["Completable", "EventWaiter", "EventWaiterClosedError"]
