"""``SteppedTorchEngine``: a torch engine whose sessions' forwards are work on one step loop.

The thinker, the talker and code2wav share this shape: each session keeps its state across
responses (its request in the loop, with its KV slot), a running ``generate`` holds an
:class:`~.torch_engine.AbortSignal`, and every forward is work queued on the engine's
:class:`~.step_loop.StepLoop`, which runs the work of every session in steps (one call
of :meth:`SteppedTorchEngine._step` in the model thread). What that shape needs besides
the model is here, once: the session table, the loop's life (started after the model is
loaded, stopped after every session was aborted and before the model thread ends),
abort, release and stop, and the one way a session feeds the loop
(:meth:`SteppedTorchEngine.feed`).

Abort and release close the session's request: its queued work fails with
:class:`~.step_loop.RequestClosedError` (the session's ``generate`` ends where it waits),
and its slot is free once no running step holds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, Field

from omni_actors.actors.engines.step_loop import Chunk, Request, StepLoop
from omni_actors.actors.engines.torch_engine import AbortSignal, TorchEngine
from omni_actors.protocols.control import StepCounts

__all__ = ["SessionState", "StepLoopArgs", "SteppedTorchEngine"]


class StepLoopArgs(BaseModel):
    """The arguments of an engine's step loop (its KV slots and its steps' sizes).

    Attributes:
        max_batch: the most single-position rows (decode steps, frames) one step runs:
            its largest CUDA graph.
        max_sessions: sessions holding a KV slot at once; a new one past it fails with
            ``SlotsExhaustedError``.
        max_tokens_per_step: a step's budget: single-position rows (one each) and
            prefill chunks together.
        max_prefill_chunk: the most positions of one prefill in one step.
        decode_ahead: a reply's first decode rows (this many after its session's last
            prefill) run in a step ahead of other sessions' prefill chunks rather than
            beside them (``StepLoop``'s ``decode_ahead``): its first tokens come
            sooner, the prompts' a step later; 0: never.
    """

    # A forward of the full-size thinker costs ~95 ms whatever its length up to ~2500
    # tokens (launches and host syncs of transformers' experts; a prefill probe on an
    # H200), so chunks of 512 made a 2500-token prompt's first token 2.5x later (804
    # against 325 ms at c=1, 2x H200): prompts go whole up to 4096 positions, and
    # several share a step up to 8192 tokens.
    max_batch: int = Field(32, ge=1)
    max_sessions: int = Field(32, ge=1)
    max_tokens_per_step: int = Field(8192, ge=1)
    max_prefill_chunk: int = Field(4096, ge=1)
    decode_ahead: int = Field(0, ge=0)


class SessionState(Protocol):
    """What the engine base reads of a session's state."""

    request: Request[Any, Any]
    """The session's request in the loop (its slot and length)."""
    signal: AbortSignal | None
    """Set while a response is being generated."""


S = TypeVar("S", bound=SessionState)
P = TypeVar("P")
Out = TypeVar("Out")


class SteppedTorchEngine(TorchEngine, Generic[S, P, Out]):
    """A :class:`TorchEngine` with per-session state ``S`` whose forwards are works of
    payload ``P`` and outputs ``Out`` on one step loop (see the module docstring).

    Subclasses implement ``_load`` and ``generate`` as a ``TorchEngine`` does, keep their
    sessions in ``_sessions``, and implement :meth:`_step`, the model-thread call that
    runs one step.

    Args:
        path: the stage's prepared directory.
        name: the model thread's name, for debugging.
        device: where the model computes.
        args: the loop's sizes.
        max_context: the most positions a session's slot holds.
        wait_s: how long an idle loop gathers work before its first step.
    """

    def __init__(
        self,
        path: Path,
        name: str,
        device: str,
        *,
        args: StepLoopArgs,
        max_context: int,
        wait_s: float = 0.0,
    ) -> None:
        super().__init__(path, name, device)
        self._sessions: dict[str, S] = {}
        self.max_sessions = args.max_sessions
        """Sessions holding a slot at once (the pipeline admits no more)."""
        self.loop: StepLoop[P, Out] = StepLoop(
            self._execute,
            slots=args.max_sessions,
            max_context=max_context,
            max_tokens_per_step=args.max_tokens_per_step,
            max_chunk=args.max_prefill_chunk,
            max_rows=args.max_batch,
            decode_ahead=args.decode_ahead,
            wait_s=wait_s,
            name=f"{name} steps",
        )
        """Every session's forwards (its statistics tell how they shared steps)."""

    def _step(self, chunks: list[Chunk[P, Out]]) -> list[Out]:
        """Model thread: one step over ``chunks``; one output per chunk, in order."""
        raise NotImplementedError

    @property
    def step_counts(self) -> StepCounts:
        """What the step loop has run since the engine started (the stage reports it)."""
        stats = self.loop.statistics()  # its fields are the counts' and more
        return StepCounts(**{name: getattr(stats, name) for name in StepCounts.__struct_fields__})

    async def _execute(self, chunks: list[Chunk[P, Out]]) -> list[Out]:
        return await self.call(self._step, chunks)

    async def start(self) -> None:
        """Load the model in the model thread, then start the step loop."""
        await super().start()
        self.loop.start()

    @property
    def active_sessions(self) -> set[str]:
        """Sessions holding state (generating, or between responses)."""
        return set(self._sessions)

    @property
    def generating(self) -> set[str]:
        """Sessions with a running ``generate``."""
        return {s for s, state in self._sessions.items() if state.signal is not None}

    async def abort(self, session: str) -> None:
        """Drop ``session``'s state and free its slot; a running ``generate`` ends where
        it waits (input, a step)."""
        state = self._sessions.pop(session, None)
        if state is None:
            return
        self.loop.close(state.request)
        if state.signal is not None:
            state.signal.abort()

    async def release(self, session: str) -> None:
        """The conversation is over: drop its state and free its slot."""
        await self.abort(session)

    async def stop(self) -> None:
        """Abort every session, let the running step end, then end the model thread."""
        for session in list(self._sessions):
            await self.abort(session)
        await self.loop.stop()
        await super().stop()

    async def feed(
        self,
        state: S,
        payload: P,
        length: int,
        then: Callable[[list[Out]], None] | None = None,
        *,
        urgent: bool = False,
    ) -> list[Out]:
        """Feed ``length`` positions of ``payload`` to ``state``'s request; one output
        per chunk it ran in. ``urgent``: before other sessions' prefills
        (:meth:`~.step_loop.StepLoop.submit`).

        ``then(outputs)`` runs as the step's update resolves the work, before this
        returns, even if the caller is cancelled meanwhile: the work runs on, so what it
        changes in the session's state (a carry, a count of user positions) must follow
        the slot, not the caller.

        Raises:
            RequestClosedError: the session was aborted or released meanwhile.
        """
        return await asyncio.shield(self.queue(state, payload, length, then, urgent=urgent))

    def queue(
        self,
        state: S,
        payload: P,
        length: int,
        then: Callable[[list[Out]], None] | None = None,
        *,
        urgent: bool = False,
    ) -> asyncio.Future[list[Out]]:
        """:meth:`feed` without waiting: the work's future (``then`` runs as it
        resolves). Work queued after it on the session runs after it, in the same step
        where the step has room.

        Raises:
            RequestClosedError: the session was aborted or released.
        """
        future = self.loop.submit(state.request, payload, length, urgent=urgent)
        if then is not None:
            apply = then

            def settle(done: asyncio.Future[list[Out]]) -> None:
                if not done.cancelled() and done.exception() is None:
                    apply(done.result())

            future.add_done_callback(settle)
        return future
