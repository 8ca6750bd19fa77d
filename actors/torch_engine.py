"""``TorchEngine``: the base of engines that run a torch model of a prepared family.

Model calls run in one worker thread per engine, never on the event loop: a forward
takes milliseconds, and the loop must keep routing every other session's chunks (and
the other stages' when they share the process) meanwhile. One thread also serialises
the engine's model calls, which is where cross-session batching happens: whatever is
pending when the thread frees up goes into the next call.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from omni_actors.model_cache import require

__all__ = ["TorchEngine", "stage_dir"]

T = TypeVar("T")


def stage_dir(args: dict[str, Any], stage: str) -> Path:
    """The prepared directory of ``stage`` from an engine's ``model``/``seed``/``cache_dir``.

    Raises:
        ModelNotPreparedError: the weights are not prepared (the message has the command).
    """
    cache_dir = args.get("cache_dir")
    root = require(
        str(args.get("model", "tiny-omni")),
        cache_dir=Path(cache_dir) if cache_dir else None,
        seed=int(args.get("seed", 0)),
    )
    return root / stage


class TorchEngine:
    """Loads a model in its own thread and runs every model call there.

    Subclasses implement ``_load(path)`` (run in the thread) and the engine protocol's
    ``generate``; they call :meth:`call` for anything that touches the model.

    Args:
        path: the stage's prepared directory.
        name: the thread's name, for debugging.
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Start the thread and load the model in it."""
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix=f"torch-{self.name}", initializer=_one_intra_op_thread
        )
        await self.call(self._load, self.path)

    def _load(self, path: Path) -> None:
        raise NotImplementedError

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in the model thread and wait for its result.

        If the caller is cancelled (an abort), the call still finishes in the thread;
        its result is dropped.
        """
        if self._executor is None:
            raise RuntimeError(f"engine {self.name} is not started")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def stop(self) -> None:
        """Wait for the running model call, then end the thread."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)


def _one_intra_op_thread() -> None:
    """Each engine computes on one core.

    Several engines (and the event loop) share a small machine; torch's default
    intra-op pool per engine oversubscribes it, and a thinker step measured 2.7 ms
    alone went to 15-21 ms under load with the default, against ~3 ms with one thread.
    The setting is process-wide, which is what is wanted: every engine here wants it.
    """
    import torch

    torch.set_num_threads(1)
