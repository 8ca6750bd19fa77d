"""CUDA awareness: device tensors leave and enter a stage without stalling its steps.

A stage that produces tensors on a GPU copies them to host memory on a stream of its
own, and the message leaves once that copy's event has completed; the event loop never
blocks and never polls meanwhile (:class:`EventWaiter`, :class:`HostStaging`). A stage
that computes on a GPU copies its inputs there on a stream of its own, and its compute
stream waits for that copy on the device (:class:`DeviceInbound`). Host memory for the
copies is allocated once, in slots (:class:`SlotPool`). A copy of a step's output waits
for that step only, by the mark the step left on its tensors (:func:`mark_step`), not
for the next step queued behind it. Without CUDA the same calls copy synchronously.
"""

from omni_actors.cuda.event_waiter import Completable, EventWaiter, EventWaiterClosedError
from omni_actors.cuda.slots import SlotPool, host_tensor
from omni_actors.cuda.staging import (
    DeviceInbound,
    HostStaging,
    StageTransfers,
    Transfer,
    cuda_device,
    on_device,
)
from omni_actors.cuda.step_ready import mark_step, step_mark, wait_ready

__all__ = [
    "Completable",
    "DeviceInbound",
    "EventWaiter",
    "EventWaiterClosedError",
    "HostStaging",
    "SlotPool",
    "StageTransfers",
    "Transfer",
    "cuda_device",
    "host_tensor",
    "mark_step",
    "on_device",
    "step_mark",
    "wait_ready",
]
