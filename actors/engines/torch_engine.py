"""``TorchEngine``: the base of engines that run a torch model of a prepared family.

Model calls run in one worker thread per engine, never on the event loop: a forward
takes milliseconds, and the loop must keep routing every other session's chunks (and
the other stages' when they share the process) meanwhile. One thread also serialises
the engine's model calls, which is where cross-session batching happens: whatever is
pending when the thread frees up goes into the next call.

Because every model call goes through that one thread, the time the thread spends in
calls is the engine's busy time (:attr:`TorchEngine.busy_s`): busy time over wall time
is how loaded the engine's device is. On a GPU a call returns once its results are on
hand (a token, a frame), so it covers the kernels and their launches alike. An engine
whose steps replay CUDA graphs counts those that ran eager instead
(:attr:`TorchEngine.eager_steps`).

An engine computes on its ``device`` (:class:`DeviceArgs`). On a GPU, once the model is
loaded, the thread's default device is set to it, so the tensors an engine makes for a
step (positions, masks, token ids) are born there; the stage moves inputs in and
outputs out on streams of its own (``omni_actors.cuda``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch
from pydantic import BaseModel, Field

from omni_actors.actors.engines.contract import Fields
from omni_actors.cuda import cuda_device
from omni_actors.cuda.step_ready import mark_step
from omni_actors.models.cache import locate
from omni_actors.models.family import WeightsArgs

__all__ = [
    "DEVICE_PATTERN",
    "AbortSignal",
    "BusyClock",
    "DeviceArgs",
    "TorchEngine",
    "resolve_device",
    "release_dir",
]


DEVICE_PATTERN = r"^(cpu|auto|cuda(:[0-9]{1,2})?)$"
"""What a device argument may say: ``cpu``, ``auto``, ``cuda`` or ``cuda:N``."""


class DeviceArgs(BaseModel):
    """The argument of an engine that computes on a device of its choosing.

    Attributes:
        device: ``cpu``, ``cuda``, ``cuda:N``, or ``auto`` (the GPU if there is one).
    """

    device: str = Field("cpu", pattern=DEVICE_PATTERN)


def resolve_device(name: str) -> torch.device:
    """The device ``name`` means here; ``auto`` is the current GPU, else the CPU.

    Raises:
        RuntimeError: a CUDA device was asked for on a machine without CUDA.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if cuda_device(device) and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


T = TypeVar("T")


PRETRAINED_LOCK = threading.Lock()
"""Held around transformers' ``from_pretrained`` in an engine's model thread.

``from_pretrained`` switches process-wide state while it builds a model (the default
device and init functions it patches to skip initialization), so two stages of one
process loading at once (the cascade's recognizer and LLM) broke each other's models:
tied weights came out on the meta device. Loads take turns; forwards do not wait."""


def release_dir(default_model: str, args: WeightsArgs, stage: str) -> Path:
    """The release directory an engine of ``stage`` loads, from its arguments: ``model``
    if given (a directory, a Hub repo id or a family), else ``default_model``'s prepared
    release, at ``seed`` in ``cache_dir``.

    Raises:
        ModelNotPreparedError: the weights are not prepared (the message has the command).
        ModelFileError: ``model`` names nothing usable (the message says why).
    """
    model = args.model or default_model
    return locate(model, cache_dir=args.cache_dir, seed=args.seed, prefixes=(f"{stage}.",))


class AbortSignal:
    """An abort that a running ``generate`` can wait on together with whatever it awaits.

    ``Engine.abort`` must end a ``generate`` promptly even while it waits for input that
    may never come, or for a batched forward behind other sessions' (the stage cancels
    its task too, but an engine must not rely on it).
    """

    def __init__(self) -> None:
        self._future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def aborted(self) -> bool:
        """Whether :meth:`abort` was called."""
        return self._future.done()

    def abort(self) -> None:
        """Wake whoever waits in :meth:`until` or :meth:`next_input`; idempotent."""
        if not self._future.done():
            self._future.set_result(None)

    async def until(self, awaitable: Awaitable[T]) -> T | None:
        """``awaitable``'s result, or None at once if the session is (or gets) aborted.

        On abort the awaitable is cancelled (work on a step loop is withdrawn: the
        loop skips it, or drops its row of a running step) and whatever it brought
        is dropped, error included. If the caller is cancelled, so is the awaitable.

        The caller's task awaits ``awaitable`` itself, an abort cancelling that task
        meanwhile: an input already buffered (a thinker token the talker's next frame
        needs) is taken without a turn of the event loop, so the session queues its
        next step before its step loop schedules one (which it does after one turn).
        Waiting in a task of its own took two or three turns; on two H200s the talker's
        frame steps held 5.2 rows of 8 sessions at c=8 and 20.4 of 32 at c=32.
        """
        if self.aborted:
            _discard(awaitable)
            return None
        task = asyncio.current_task()
        assert task is not None, "until runs in a task"
        waiting = True
        cancelled = False

        def on_abort(_: asyncio.Future[None]) -> None:
            # Scheduled when the abort comes: it may run after the await is over.
            nonlocal cancelled
            if waiting:
                cancelled = True
                task.cancel()

        self._future.add_done_callback(on_abort)
        try:
            result = await awaitable
            # Aborted as it completed (the cancel not delivered yet): dropped too.
            return None if self.aborted else result
        except asyncio.CancelledError:
            # Ours alone (no other cancel of the task pending): the abort's None.
            if cancelled and task.uncancel() == 0:
                return None
            raise
        except Exception:
            if self.aborted:  # failed by the abort (its work withdrawn): dropped
                return None
            raise
        finally:
            waiting = False
            self._future.remove_done_callback(on_abort)

    async def next_input(self, inputs: AsyncIterator[Fields]) -> Fields | None:
        """The next input chunk, or None once the input ended or the session was aborted."""
        if self.aborted:
            return None
        return await self.until(anext(inputs, None))


def _discard(awaitable: Awaitable[Any]) -> None:
    """Drop an awaitable no one will await: close a coroutine, cancel a future."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()
    elif isinstance(awaitable, asyncio.Future):
        awaitable.cancel()


class BusyClock:
    """Seconds spent inside the calls run through :meth:`run`, readable from any thread
    at any moment, a call under way counted as far as it got (so a reading taken at
    the end of a measurement is not short by the call in flight)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0.0
        self._since: float | None = None

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()``, its duration added to :attr:`seconds`; calls must not overlap."""
        with self._lock:
            self._since = time.perf_counter()
        try:
            return fn()
        finally:
            with self._lock:
                assert self._since is not None, "BusyClock.run calls overlapped"
                self._total += time.perf_counter() - self._since
                self._since = None

    @property
    def seconds(self) -> float:
        """The time spent in calls so far, the one under way included."""
        with self._lock:
            running = 0.0 if self._since is None else time.perf_counter() - self._since
            return self._total + running


class TorchEngine:
    """Loads a model in its own thread and runs every model call there.

    Subclasses implement ``_load(path)`` (run in the thread) and the engine protocol's
    ``generate``; they call :meth:`call` for anything that touches the model.

    Args:
        path: the stage's prepared directory.
        name: the thread's name, for debugging.
        device: where the model computes (see :func:`resolve_device`).

    Attributes:
        device: the resolved device; ``_load`` must put the model there.
    """

    def __init__(self, path: Path, name: str, device: str = "cpu") -> None:
        self.path = path
        self.name = name
        self.device = resolve_device(device)
        self._executor: ThreadPoolExecutor | None = None
        self._busy: BusyClock | None = None  # set once started: loading is not serving

    @property
    def busy_s(self) -> float:
        """Seconds the model thread has spent in model calls since the engine started
        (loading excluded); 0 before. Read it twice: the difference over the wall time
        between the readings is the fraction of that time the engine was busy."""
        return 0.0 if self._busy is None else self._busy.seconds

    @property
    def eager_steps(self) -> int | None:
        """Steps run eager although the engine replays them from CUDA graphs (more rows
        than its largest graph, a shape whose graph failed or differed): 0 while every
        step replays. None: the engine has no graphs (on the CPU, turned off), or is not
        loaded yet. Engines with graphs override it."""
        return None

    async def start(self) -> None:
        """Start the thread and load the model in it (then make its device the thread's
        default: loading itself runs on the CPU defaults)."""
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix=f"torch-{self.name}", initializer=_one_intra_op_thread
        )
        if self.device.type == "cuda":  # loading may compute (checks, graph captures)
            await self.call(torch.cuda.set_device, self.device)
        await self.call(self._load, self.path)
        if self.device.type != "cpu":
            await self.call(_compute_on, self.device)
        self._busy = BusyClock()

    def _load(self, path: Path) -> None:
        raise NotImplementedError

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in the model thread and wait for its result.

        If the caller is cancelled (an abort), the call still finishes in the thread;
        its result is dropped. On a GPU, the tensors it returns on the engine's device
        carry the mark of the step (:mod:`~omni_actors.cuda.step_ready`): copies of
        them wait for this call's work, not for the next call queued behind it.
        """
        if self._executor is None:
            raise RuntimeError(f"engine {self.name} is not started")
        loop = asyncio.get_running_loop()
        work = functools.partial(fn, *args, **kwargs)
        if self.device.type == "cuda":
            work = functools.partial(_marked, work, self.device)
        busy = self._busy
        if busy is not None:
            work = functools.partial(busy.run, work)
        return await loop.run_in_executor(self._executor, work)

    async def stop(self) -> None:
        """Wait for the running model call, then end the thread."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)


def _marked(work: Callable[[], T], device: torch.device) -> T:
    """Model thread: ``work()``, its tensors on ``device`` marked as this step's."""
    result = work()
    mark_step(result, device)
    return result


def _compute_on(device: torch.device) -> None:
    """Make ``device`` the calling thread's default for new tensors and its current GPU
    (both settings are per thread: other engines in the process keep theirs)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_default_device(device)


def _one_intra_op_thread() -> None:
    """Each engine computes on one core.

    Several engines (and the event loop) share a small machine; torch's default
    intra-op pool per engine oversubscribes it, and a thinker step measured 2.7 ms
    alone went to 15-21 ms under load with the default, against ~3 ms with one thread.
    The setting is process-wide, which is what is wanted: every engine here wants it.
    """
    torch.set_num_threads(1)
