"""``VllmRuntime``: vLLM's ``AsyncLLM`` in this process, and the processes it starts.

``AsyncLLM`` always runs its EngineCore (and, unless it runs the model itself, a worker)
in processes of its own, children of the stage's worker process. They are in the
worker's process group, which the pipeline kills when the worker ends
(``transport.process_placement``), so none outlives a crashed or killed worker. While
the stage runs, the runtime watches their sentinels on the event loop (no polling): an
exit resolves :attr:`VllmRuntime.died`, and the stage fails and is restarted by its
supervisor.

**On a CPU** vLLM's defaults assume it has the machine to itself: the model runs in a
worker process of its own, which waits for each step, and the EngineCore for its
results, by spinning on shared memory (the worker for a full second after each burst),
with every core's OpenMP thread. Beside a talker and code2wav on the same cores that
spinning takes the CPU they need: on a 2-core machine the first audio of tiny-omni-vllm
came after 533 ms, against 137 ms with the model inside the EngineCore (vLLM's ``uni``
executor) on ``cpu_threads`` threads (1 by default), which :func:`cpu_engine_args` sets
unless the pipeline chose otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Final

from omni_actors.errors import EngineError, OmniError
from omni_actors.models.cache import locate

__all__ = [
    "SAFETENSORS_LOAD_FORMATS",
    "EngineDiedError",
    "VllmRuntime",
    "cpu_engine_args",
    "resolve_checkpoint",
    "safetensors_engine_args",
]

log = logging.getLogger(__name__)


class EngineDiedError(OmniError):
    """vLLM's EngineCore process exited: the stage fails and its supervisor restarts it."""

    code = "stage_failed"


def resolve_checkpoint(model: str, cache_dir: Path | None, seed: int) -> Path:
    """The release directory ``model`` names: a directory, a Hugging Face repo id, or a
    prepared model family (its release at ``seed`` in ``cache_dir``).

    Raises:
        ModelFileError: none of these (the message says why).
        ModelNotPreparedError: the family's weights are not prepared.
    """
    return locate(model, cache_dir=cache_dir, seed=seed, prefixes=("thinker.",))


def cpu_engine_args(engine_args: dict[str, Any], threads: int | None) -> dict[str, Any]:
    """``engine_args`` for vLLM on a CPU sharing the machine (see the module docstring).

    A single-process model (no tensor or pipeline parallelism) with no executor chosen
    runs in the EngineCore (``uni``); vLLM's CPU platform takes that only with
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in the environment, which this sets unless the
    caller set it. ``threads`` becomes the engine process's ``OMP_NUM_THREADS``. The
    environment is this worker process's, which serves this one engine; vLLM's
    processes inherit it.
    """
    args = dict(engine_args)
    single = all(args.get(name, 1) == 1 for name in _PARALLEL)
    if single and args.get("distributed_executor_backend") is None:
        args["distributed_executor_backend"] = "uni"
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    return args


_PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")

SAFETENSORS_LOAD_FORMATS: Final = ("safetensors", "fastsafetensors", "runai_streamer", "dummy")
"""vLLM ``load_format`` values that read no pickle-based weights file (``dummy`` reads
no file at all)."""


def safetensors_engine_args(engine_args: dict[str, Any]) -> dict[str, Any]:
    """``engine_args`` with vLLM loading safetensors only (see :mod:`omni_actors.models.files`).

    vLLM's default ``load_format``, ``auto``, falls back to ``*.bin`` and ``*.pt`` files
    (pickles) when a checkpoint has no safetensors, and ``pt`` or ``npcache`` read only
    those; this sets ``safetensors`` unless the pipeline chose one of
    :data:`SAFETENSORS_LOAD_FORMATS`.

    Raises:
        EngineError: the pipeline chose another format.
    """
    args = dict(engine_args)
    chosen = str(args.setdefault("load_format", "safetensors")).lower()
    if chosen not in SAFETENSORS_LOAD_FORMATS:
        raise EngineError(
            f"engine_args.load_format {chosen!r} may load pickle-based weights, which can "
            f"run code; use one of {', '.join(SAFETENSORS_LOAD_FORMATS)} (or leave it out)"
        )
    return args


class VllmRuntime:
    """A started ``AsyncLLM`` and the watch on its processes; see the module docstring.

    Attributes:
        llm: the ``AsyncLLM``.
        died: resolves with an :class:`EngineDiedError` when one of its processes exits
            before :meth:`stop`.
    """

    def __init__(self, llm: Any, children: list[BaseProcess]) -> None:
        self.llm = llm
        loop = asyncio.get_running_loop()
        self.died: asyncio.Future[BaseException] = loop.create_future()
        self._stopping = False
        self._children = children
        for proc in children:
            loop.add_reader(proc.sentinel, self._exited, proc)

    @classmethod
    async def start(
        cls, model: Path, engine_args: dict[str, Any], *, cpu_threads: int | None = None
    ) -> VllmRuntime:
        """Start vLLM on ``model`` with these ``AsyncEngineArgs`` fields (tens of seconds);
        loading safetensors only (:func:`safetensors_engine_args`), and on a CPU adjusted
        by :func:`cpu_engine_args` with ``cpu_threads``.

        It blocks this process's event loop while vLLM starts: ``AsyncLLM`` binds its
        sockets to the loop it is built on, and a stage worker has nothing else to do
        until its engine is up.
        """
        engine_args = safetensors_engine_args(engine_args)
        # vLLM logs to stdout unless told otherwise; stdout is the caller's (``bench
        # --json``, a CLI's output). Its processes inherit the setting.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        if current_platform.is_cpu():
            engine_args = cpu_engine_args(engine_args, cpu_threads)
        args = AsyncEngineArgs(model=str(model), **engine_args)
        before = set(multiprocessing.active_children())
        llm = AsyncLLM.from_engine_args(args)
        try:
            return cls(llm, list(set(multiprocessing.active_children()) - before))
        finally:
            # A traceback vLLM's imports keep holds this frame: it must not hold the
            # engine too, or :meth:`stop` could not let it go (see there).
            del llm

    def _exited(self, proc: BaseProcess) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(proc.sentinel)
        if self._stopping or self.died.done():
            return
        proc.join(0)
        error = EngineDiedError(
            f"vLLM engine process {proc.name} (pid {proc.pid}) exited with code {proc.exitcode}"
        )
        log.error("%s", error)
        self.died.set_result(error)

    def unfinished_requests(self) -> int:
        """Requests vLLM itself still tracks."""
        count: int = self.llm.output_processor.get_num_unfinished_requests()
        return count

    async def stop(self) -> None:
        """Shut vLLM down: its processes exit (that is no failure)."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        for proc in self._children:
            loop.remove_reader(proc.sentinel)
        await asyncio.to_thread(self.llm.shutdown)
        # Collected now, not at interpreter exit, where ``AsyncLLM.__del__`` shuts down
        # again with its module's globals already cleared (a spurious error on stderr).
        self.llm = None
        gc.collect()
