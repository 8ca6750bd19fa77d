"""``SessionPath``: the stages on one session's path, and what a session asks of them all.

A :class:`~omni_actors.pipeline.session_actor.SessionActor` faces two ways: the caller,
to whom it hands events in segment order, and the stages, which it drives together.
This is the second: prewarm every stage by the admission deadline, stop a response on
every stage, walk a truncation back from the audio to the entry stage, and free the
session on every stage when it ends. The stages know the session by its ``SessionKey``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from omni_actors import remoting
from omni_actors._ref import ActorRef
from omni_actors.errors import ActorRestartingError, OmniError, WorkerDiedError
from omni_actors.protocols.control import (
    Abort,
    Cancel,
    Deadlines,
    Prewarm,
    SessionMessage,
    StageMessage,
    Target,
    Truncate,
)
from omni_actors.protocols.stage import INPUT, SessionKey

__all__ = ["SessionPath", "StagePlan"]

log = logging.getLogger(__name__)

_ASK_TIMEOUT = 5.0  # an abort or a truncate: the stage answers from its own state


@dataclass(frozen=True, slots=True)
class StagePlan:
    """What one stage on a session's path needs at prewarm, and its ref."""

    ref: ActorRef[StageMessage]
    sources: tuple[str, ...]
    targets: tuple[Target, ...]
    emit: tuple[str, ...]


class SessionPath:
    """The stages of one session (see the module docstring).

    Args:
        session: the session's id (in log lines).
        key: the session's key on the stages.
        plan: the stages on the path, in topological order, with their prewarm plans.
        transcriber: the stage of ``plan`` that transcribes the caller's input ("" if
            none): a response's cancel does not reach it (its transcripts are of the
            user's turns, which a cancelled reply does not take back).
    """

    def __init__(
        self, session: str, key: SessionKey, plan: dict[str, StagePlan], transcriber: str = ""
    ) -> None:
        self.session = session
        self.key = key
        self.plan = plan
        self.transcriber = transcriber
        self._opened: dict[str, float] = {}  # when each stage took the key (monotonic)

    async def prewarm(
        self,
        owner: ActorRef[SessionMessage],
        *,
        resumable: bool,
        deadlines: Deadlines,
        window: int,
        timeout: float,
        segment: int = 0,
    ) -> tuple[str, BaseException] | None:
        """Prewarm every stage at once, within ``timeout``, to serve from ``segment`` on;
        the first stage (in path order) that failed, with why, or None when all are
        ready."""

        async def prewarm(stage: str, p: StagePlan) -> bool:
            while True:
                # The prewarm names the stage's targets: a target restarting has no worker
                # to name until it is up again, so wait for it (the prewarm's time counts).
                for target in p.targets:
                    await remoting.sendable(target.ref)
                try:
                    taken = await ask(p)
                    if taken:
                        self._opened[stage] = time.monotonic()
                    return taken
                except WorkerDiedError:
                    continue  # it died with the prewarm: its restart takes the next one
                except ActorRestartingError:
                    # A target died again while the prewarm waited for this stage (its
                    # own restart): the prewarm goes once that target is back.
                    continue

        async def ask(p: StagePlan) -> bool:
            return await p.ref.ask(
                Prewarm(
                    key=self.key,
                    owner=owner,
                    sources=p.sources,
                    targets=p.targets,
                    emit=p.emit,
                    resumable=resumable,
                    deadlines=deadlines,
                    window=window,
                    segment=segment,
                ),
                timeout=timeout,
            )

        asks = [asyncio.wait_for(prewarm(name, p), timeout) for name, p in self.plan.items()]
        results = await asyncio.gather(*asks, return_exceptions=True)
        for stage, result in zip(self.plan, results, strict=True):
            if result is False:
                result = RuntimeError("the stage refused it (session aborted or already open)")
            if isinstance(result, BaseException):
                return stage, result
        return None

    def opened_since(self, stage: str, at: float) -> bool:
        """Whether ``stage`` took the session's key after ``at`` (``time.monotonic``).

        A failed stage answers nothing after its failure (an ask to a worker that died
        fails as its death is noticed, before the orchestrator hears of it), so a stage
        that took the key after its failure was heard of took it on its restarted
        instance: the session lost nothing there.
        """
        opened = self._opened.get(stage)
        return opened is not None and opened > at

    async def cancel(self, segment: int) -> None:
        """Tell every stage (but the transcriber) to stop response ``segment``."""
        for name, p in self.plan.items():
            if name != self.transcriber:
                await p.ref.tell(Cancel(key=self.key, segment=segment))

    async def truncate(self, samples: int) -> dict[str, int] | str:
        """Walk a truncation back from the audio: each stage keeps what the user heard of
        the last reply (the audio stage ``samples``) and answers what its sources keep.

        Returns:
            What each stage on the way from the entry to the audio keeps of the last
            reply's outputs (the entry's: what its caller sends in a truncate mark), or
            why the truncation cannot be made.
        """
        answers: dict[str, int] = {}  # per stage: what its sources keep
        keeps: dict[str, int] = {}
        for name in reversed(self.plan):  # the plan is in topological order
            plan = self.plan[name]
            if "audio" in plan.emit:
                kept = samples
            else:
                shares = [answers[t.stage] for t in plan.targets if t.stage in answers]
                if not shares:
                    continue  # not on the way to the audio
                kept = min(shares)
            keeps[name] = kept
            if INPUT in plan.sources:
                return keeps
            try:
                answer = await plan.ref.ask(Truncate(key=self.key, kept=kept), timeout=_ASK_TIMEOUT)
            except (OmniError, TimeoutError) as exc:  # the stage died, or is restarting
                return f"stage {name} did not answer: {exc}"
            if not isinstance(answer, int):
                return answer.reason
            answers[name] = answer
        return "no audio reaches the caller to truncate"

    async def abort(self, reason: str, skip: str = "", only: str = "") -> None:
        """Free the session on every stage (but ``skip``, one that lost it already; or
        on ``only``); a stage that fails to answer is logged."""
        stages = [name for name in self.plan if name != skip and (not only or name == only)]
        asks = [
            self.plan[name].ref.ask(Abort(key=self.key, reason=reason), timeout=_ASK_TIMEOUT)
            for name in stages
        ]
        for stage, result in zip(
            stages, await asyncio.gather(*asks, return_exceptions=True), strict=True
        ):
            if isinstance(result, BaseException):
                log.warning("session %s: abort on %s failed: %r", self.session, stage, result)
