"""``BatchedTorchEngine``: a torch engine whose sessions share forwards.

tiny-omni's engines share one shape: each session keeps its own state across responses
(a thinker's or talker's KV cache, code2wav's last reply length), a running ``generate``
holds an :class:`AbortSignal`, and each unit of work of a session (a decode step, a
codec window) is submitted to one :class:`Batcher`, so the work of every session
pending at the time runs in one forward in the model thread. What that shape needs
besides the model is here, once: the session table, the batcher's life (started after
the model is loaded, stopped after every session was told to end and before the model
thread ends), abort, release and stop, and what a test or a metric reads of the
sessions. What a request is, how requests group (the batcher's rule), and what a
response does, stays the engine's.

Abort, release and stop work one way for every such engine: the session's state is
dropped at once and its signal aborted, so its ``generate`` ends promptly where it waits
(for input, or for a request, withdrawn from the batcher) and yields nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from omni_actors.actors.engines.batcher import Batcher
from omni_actors.actors.engines.torch_engine import AbortSignal, TorchEngine

__all__ = ["BatchedTorchEngine", "SessionState"]


class SessionState(Protocol):
    """What the engine base reads of a session's state: whether a response runs."""

    signal: AbortSignal | None
    """Set while a response is being generated (cleared when it ends)."""


S = TypeVar("S", bound=SessionState)
R = TypeVar("R")
T = TypeVar("T")


class BatchedTorchEngine(TorchEngine, Generic[S, R, T]):
    """A :class:`TorchEngine` with per-session state ``S`` and requests ``R`` batched
    into results ``T`` (see the module docstring).

    Subclasses implement ``_load`` and ``generate`` as a ``TorchEngine`` does, keep their
    sessions in ``_sessions``, and implement :meth:`_run_steps`, the model-thread call
    that runs one batch.

    Args:
        path: the stage's prepared directory.
        name: the model thread's name, for debugging.
        max_batch: the most sessions whose requests share one forward.
        batcher_name: the batcher task's name, for debugging and its log line.
        group_by: the batcher's grouping rule (see :class:`Batcher`): None for step
            batches, else the key requests sharing a forward have in common.
        wait_s: how long an idle batcher gathers before its first forward.
    """

    def __init__(
        self,
        path: Path,
        name: str,
        *,
        max_batch: int,
        batcher_name: str,
        group_by: Callable[[R], Hashable] | None = None,
        wait_s: float = 0.0,
        device: str = "cpu",
    ) -> None:
        super().__init__(path, name, device)
        self._sessions: dict[str, S] = {}
        self.batcher: Batcher[R, T] = Batcher(
            self._batch, max_batch=max_batch, group_by=group_by, wait_s=wait_s, name=batcher_name
        )
        """Every session's requests (its counters tell how many shared a forward)."""

    def _run_steps(self, steps: list[R]) -> list[T]:
        """Model thread: one forward for a batch of requests (decode steps, windows);
        one result per request, in order."""
        raise NotImplementedError

    async def _batch(self, steps: list[R]) -> list[T]:
        return await self.call(self._run_steps, steps)

    async def start(self) -> None:
        """Load the model in the model thread, then start the batcher."""
        await super().start()
        self.batcher.start()

    @property
    def active_sessions(self) -> set[str]:
        """Sessions holding state (generating, or between responses)."""
        return set(self._sessions)

    @property
    def generating(self) -> set[str]:
        """Sessions with a running ``generate``."""
        return {s for s, state in self._sessions.items() if state.signal is not None}

    async def abort(self, session: str) -> None:
        """Drop ``session``'s state; a running ``generate`` ends where it waits (input,
        a request in the batcher) or at its next step."""
        state = self._sessions.pop(session, None)
        if state is not None and state.signal is not None:
            state.signal.abort()

    async def release(self, session: str) -> None:
        """The conversation is over: drop its state (a KV cache, a last reply's length)."""
        await self.abort(session)

    async def stop(self) -> None:
        """Abort every session, run the requests already queued (their sessions end
        there), then end the model thread."""
        for session in list(self._sessions):
            await self.abort(session)
        await self.batcher.stop()
        await super().stop()
