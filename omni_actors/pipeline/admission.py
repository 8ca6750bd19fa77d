"""``Admission``: a session's way into its pipeline, and the slot it holds there.

A session is admitted in three steps, each by the same ``deadlines.admission_s``: a slot
among the pipeline's ``max_sessions`` (a full pipeline makes the caller wait, not fail,
until that deadline), the orchestrator's :class:`StartSession` (the session's actor,
entry stage and key), and the session actor's :class:`OpenSession` (every stage on the
path prewarmed). A step that fails ends the session's channel with the
:class:`SessionError` the caller reads, whose ``code`` says which phase failed. The
slot is held from the first step until :meth:`Admission.release`, whatever became of
the rest: the caller's ``Session`` gives it back when it closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_actors.clock import timeout_at
from omni_actors.errors import OmniError
from omni_actors.pipeline.orchestrator import Admitted, StartSession
from omni_actors.protocols.control import OpenSession
from omni_actors.protocols.events import SessionError

if TYPE_CHECKING:
    from omni_actors.pipeline.omni_pipeline import OmniPipeline

__all__ = ["Admission"]

_GRACE_S = 5.0  # beyond the admission deadline: the session actor's prewarm times out first


class Admission:
    """One session's admission (see the module docstring).

    Args:
        pipeline: the pipeline the session enters.
        start: the request to the orchestrator (the session's id, what it wants, its
            admission deadline and its channel).
    """

    def __init__(self, pipeline: OmniPipeline, start: StartSession) -> None:
        self.pipeline = pipeline
        self.start = start
        self._slot = False

    async def admit(self) -> Admitted | SessionError:
        """A slot, then the orchestrator's admission: the session's actor and entry stage,
        or the error the session ended with."""
        clock = self.pipeline.clock
        deadline = self.start.admission_deadline
        try:
            async with timeout_at(clock, deadline):
                await self.pipeline.session_slots.acquire()
            self._slot = True
            reply = await self.pipeline.orchestrator.ask(
                self.start, timeout=max(0.001, deadline - clock.now())
            )
        except (OmniError, TimeoutError) as exc:
            return self._refused(exc)
        if isinstance(reply, OmniError):
            return self._closed(
                SessionError(session=self.start.session, code=reply.code, message=str(reply))
            )
        return reply

    async def prewarm(self, admitted: Admitted) -> SessionError | None:
        """Every stage prewarmed through the session's actor; the error the session ended
        with if one failed."""
        clock = self.pipeline.clock
        timeout = max(0.001, self.start.admission_deadline - clock.now()) + _GRACE_S
        try:
            return await admitted.session.ask(OpenSession(), timeout=timeout)
        except (OmniError, TimeoutError) as exc:
            return self._refused(exc)

    def release(self) -> None:
        """Give the slot back (once; nothing if none was taken)."""
        if self._slot:
            self._slot = False
            self.pipeline.session_slots.release()

    def _refused(self, exc: OmniError | TimeoutError) -> SessionError:
        session = self.start.session
        if not isinstance(exc, TimeoutError):  # the pipeline itself has stopped
            return self._closed(SessionError(session=session, code=exc.code, message=str(exc)))
        admission_s = self.pipeline.spec.deadlines.admission_s
        return self._closed(
            SessionError(
                session=session,
                code="admission",
                message=(
                    f"not admitted within {admission_s:g}s "
                    f"({self.pipeline.max_sessions} sessions at most); retry later or "
                    "raise deadlines.admission_s / max_sessions"
                ),
            )
        )

    def _closed(self, error: SessionError) -> SessionError:
        self.start.channel.end(error)
        return error
