"""``ActorCell``: the runtime behind one actor — its task, mailbox, lifecycle and stash.

A cell outlives the actor instances it hosts: a restart swaps the instance and keeps the
mailbox, the stash and every ``ActorRef``. The cell's single task is the only code that
touches the instance, so an actor never sees two messages at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from omni_actors import _system_messages as sm
from omni_actors._actor import Actor
from omni_actors._context import ActorContext
from omni_actors._mailbox import Envelope, Mailbox, MailboxConfig, ReplySink
from omni_actors._props import Props, check_spawn_kwargs
from omni_actors._ref import ActorRef
from omni_actors._state import CellState
from omni_actors._supervisor import Supervisor
from omni_actors._task_scope import TaskScope
from omni_actors.errors import ActorNameTakenError, ActorStoppedError, StartTimeoutError
from omni_actors.protocols.message import ControlMessage
from omni_actors.remoting import PlacedActor
from omni_actors.signals import ChildFailed, Terminated
from omni_actors.supervision import RestartType, SupervisorStrategy

if TYPE_CHECKING:
    from omni_actors._system import ActorSystem
    from omni_actors.remoting import Hosting

__all__ = ["ActorCell"]

log = logging.getLogger("omni_actors")

_names = itertools.count(1)
# Enum members are class-attribute lookups (~0.2 us each on CPython 3.11); the message
# loop checks the state once per message, so it compares against a module constant.
_RUNNING = CellState.RUNNING


class _Exit:
    """Returned up the loop when the cell must terminate with ``reason``."""

    __slots__ = ("reason",)

    def __init__(self, reason: BaseException | None) -> None:
        self.reason = reason


class Rest:
    """The rest of a message an idle actor took at once (``ActorCell.receive_now``),
    queued for its own task; it belongs to the instance that took the message (a
    restarted one skips it)."""

    __slots__ = ("instance", "rest")

    def __init__(self, instance: Actor[Any], rest: Callable[[], Awaitable[None]]) -> None:
        self.instance = instance
        self.rest = rest


class ActorCell:
    """Runs one actor: creates instances, drives its mailbox, reports to its parent."""

    def __init__(
        self,
        system: ActorSystem,
        parent: ActorCell | None,
        name: str,
        actor_cls: type[Actor[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        restart: RestartType,
        strategy: SupervisorStrategy,
        mailbox: MailboxConfig,
        hosting: Hosting | None = None,
    ) -> None:
        self.system = system
        self.parent = parent
        self.name = name
        self.path: str = "/" if parent is None else parent.child_path(name)
        self.actor_cls = actor_cls
        self.args = args
        self.kwargs = kwargs
        self.restart = restart
        self.accepts = actor_cls.accepts
        # An actor placed elsewhere (a worker process) is hosted by a local stand-in
        # behind the placement's forwarding mailbox; everything else here is unchanged.
        self.placed = hosting is not None
        self.receives_now = actor_cls.receives_now if hosting is None else frozenset()
        self.mailbox = Mailbox(self.path, mailbox) if hosting is None else hosting.mailbox
        self.instance_factory: Callable[[], Actor[Any]] = (
            (lambda: actor_cls(*args, **kwargs)) if hosting is None else hosting.host
        )
        self.stash: deque[Envelope] = deque()
        self.children: dict[str, ActorCell] = {}
        self.watchers: set[ActorCell] = set()
        self.watching: set[ActorCell] = set()
        self.supervisor = Supervisor(self, strategy)
        self.ref: ActorRef[Any] = ActorRef(self)
        self.context: ActorContext[Any] = ActorContext(self)
        self.tasks = TaskScope(self.path, system._create_task)
        self.instance: Actor[Any] | None = None
        self.state = CellState.STARTING
        self.stop_requested = False
        self.task: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        self.started: asyncio.Future[None] = loop.create_future()
        self.terminated: asyncio.Future[BaseException | None] = loop.create_future()
        self._current_reply: ReplySink | None = None
        self._stopping_children = False
        self.escalation: BaseException | None = None  # set by the supervisor, see _fail

    # -- children -----------------------------------------------------------------

    def child_path(self, name: str) -> str:
        """The path a child called ``name`` has."""
        return f"{self.path.rstrip('/')}/{name}"

    async def spawn_child(
        self,
        actor_cls: type[Actor[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        name: str | None,
        props: Props,
    ) -> ActorRef[Any]:
        """Create a child, wait for its ``on_start``, and return its ref."""
        if not (isinstance(actor_cls, type) and issubclass(actor_cls, Actor)):
            raise TypeError(f"spawn() needs an Actor subclass, got {actor_cls!r}")
        if not isinstance(props, Props):
            raise TypeError(f"spawn(props=...) needs a Props, got {props!r}")
        check_spawn_kwargs(actor_cls, kwargs)
        if self.state.ending:
            raise ActorStoppedError(self.path, "a stopping actor cannot spawn children")
        if name is None:
            name = f"{actor_cls.__name__.lower()}-{next(_names)}"
        elif not name or "/" in name:
            raise ValueError(f"actor names must be non-empty and contain no '/', got {name!r}")
        if name in self.children:
            raise ActorNameTakenError(f"{self.path} already has a child named {name!r}")
        config = props.mailbox or actor_cls.mailbox
        hosting: Hosting | None = None
        if props.placement is not None:
            placed = PlacedActor(self.child_path(name), actor_cls, args, kwargs, config, props.host)
            hosting = await self.system._place(props.placement, placed)
        child = ActorCell(
            self.system,
            self,
            name,
            actor_cls,
            args,
            kwargs,
            props.restart,
            props.strategy or actor_cls.supervisor_strategy,
            config,
            hosting,
        )
        self.children[name] = child
        self.system._register(child)
        child.task = self.system._create_task(child._run(), name=f"actor {child.path}")
        deadline = asyncio.timeout(props.start_timeout)
        try:
            async with deadline:
                await asyncio.shield(child.started)
        except TimeoutError:
            if not deadline.expired():
                # on_start itself raised a TimeoutError (a grandchild's start timed
                # out): that error is the one to report, not this child's deadline.
                raise
            # Queued first: if on_start swallows the cancellation and completes anyway,
            # the actor stops at once instead of running unannounced.
            child.mailbox.push_system(sm.Stop())
            child.kill()
            await asyncio.wait([child.terminated], timeout=self.system.stop_timeout)
            raise StartTimeoutError(child.path, props.start_timeout) from None
        return child.ref

    async def stop(self, timeout: float) -> None:
        """Stop gracefully; kill (cancel the task) if that takes longer than ``timeout``."""
        if self.terminated.done():
            return
        self.mailbox.push_system(sm.Stop())
        if await self._wait_terminated(timeout, patient=True):
            return
        log.warning("actor %s did not stop within %gs; killing it", self.path, timeout)
        self.kill()
        if not await self._wait_terminated(timeout, patient=False):
            log.error("actor %s ignored cancellation and is abandoned", self.path)

    async def _wait_terminated(self, timeout: float, *, patient: bool) -> bool:
        """Wait up to ``timeout`` for termination, while stopping children not counted.

        Each child has a deadline of its own, so time spent stopping them must not
        count against this actor's deadline (else a parent would always be killed
        before its children finished stopping).
        """
        while True:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self.terminated)
                return True
            except TimeoutError:
                if not (patient and self._stopping_children):
                    return False

    def kill(self) -> None:
        """Cancel the cell's task: the current message is interrupted, cleanup still runs."""
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def stop_children(self) -> None:
        """Stop every child, most recently started first."""
        self._stopping_children = True
        try:
            for child in reversed(list(self.children.values())):
                await child.stop(self.system.stop_timeout)
        finally:
            self._stopping_children = False

    # -- the task -----------------------------------------------------------------

    async def _run(self) -> None:
        reason: BaseException | None = None
        try:
            try:
                await self._start_instance(None, first=True)
            except Exception as exc:
                reason = exc
                self.started.set_exception(exc)
                return
            self.started.set_result(None)
            reason = await self._loop()
        except asyncio.CancelledError:
            reason = ActorStoppedError(self.path, "killed")
            raise
        except Exception as exc:
            # A bug in the runtime itself: stop this actor cleanly rather than hang it.
            log.exception("internal error in actor %s", self.path)
            reason = exc
        finally:
            self._finalize(reason)

    async def _start_instance(self, cause: BaseException | None, *, first: bool) -> None:
        self.stop_requested = False
        self.escalation = None
        instance = self.instance_factory()
        instance._context = self.context
        try:
            if not first:
                await instance.on_restart(cause)
            await instance.on_start()
        except BaseException:
            # A half-started instance gets no on_stop, but its children must not outlive it.
            await self.stop_children()
            raise
        self.instance = instance
        self.state = CellState.RUNNING

    async def _loop(self) -> BaseException | None:
        mailbox = self.mailbox
        system = mailbox.system
        user = mailbox.user
        stash = self.stash
        stash_capacity = mailbox.config.stash_capacity
        while True:
            exit_: _Exit | None = None
            if system:
                exit_ = await self._on_system(system.popleft())
            elif self.state is _RUNNING:
                if stash:
                    exit_ = await self._process(stash.popleft())
                elif user:
                    exit_ = await self._process(mailbox.pop_user())
                else:
                    await mailbox.wait(False)
            elif user and len(stash) < stash_capacity:
                stash.append(mailbox.pop_user())
            else:
                await mailbox.wait(bool(user))
            if exit_ is not None:
                await self._terminate()
                return exit_.reason

    def receive_now(self, message: object, reply: ReplySink | None) -> bool:
        """Hand ``message`` to the idle actor's ``Actor.receive_now``, inside the
        sender's ``tell``; False if it must take the mailbox: not one of its
        ``receives_now`` types, or the actor is busy, has messages waiting, is restarting
        or stopping.

        Why: a stage's chunk wakes the receiving actor's task, which then hands the
        chunk on and parks again; on a loop moving thousands of chunks a second, those
        wake-ups are a large part of the CPU per chunk. An *idle* actor (its task parked
        on an empty mailbox, nothing stashed, not restarting or stopping) takes the
        message in the sender's task instead, because it would have been the next one
        handled anyway: the order of messages stays the mailbox's.

        What ``receive_now`` raises fails the actor through the system lane, as a failure
        of ``receive`` does (and ``reply``, if any, gets the exception); the rest it
        returns is queued first in the (empty) mailbox, so it runs before any later
        message.
        """
        mailbox = self.mailbox
        if (
            type(message) not in self.receives_now
            or self.state is not _RUNNING
            or self.stop_requested
            or self.stash
            or not mailbox.idle
        ):
            return False
        instance = self.instance
        assert instance is not None
        try:
            rest = instance.receive_now(message)
        except Exception as exc:
            if reply is not None and not reply.done():
                reply.set_exception(exc)
            mailbox.push_system(sm.Fail(exc))  # handled next, as receive's failure is
            return True
        if rest is not None:
            mailbox.push_remote((Rest(instance, rest), reply))  # the mailbox was empty
        elif reply is not None and not reply.done():
            reply.set_result(None)
        return True

    async def _process(self, envelope: Envelope) -> _Exit | None:
        message, reply = envelope
        instance = self.instance
        assert instance is not None
        # Kept while receive runs so that a kill (cancellation) still fails the asker:
        # _finalize answers it. Cleared on every other way out.
        self._current_reply = reply
        try:
            if type(message) is Rest:
                result = None
                if message.instance is instance:  # not a predecessor's, after a restart
                    await message.rest()
            else:
                result = await instance.receive(message)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            self._current_reply = None
            return self._failed(exc, reply)
        except Exception as exc:
            self._current_reply = None
            return self._failed(exc, reply)
        self._current_reply = None
        if reply is not None and not reply.done():
            reply.set_result(result)
        if self.stop_requested:
            return self._fail(None)
        return None

    def _failed(self, exc: BaseException, reply: ReplySink | None) -> _Exit | None:
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        log.debug("actor %s failed: %r", self.path, exc)
        return self._fail(exc)

    def _fail(self, error: BaseException | None) -> _Exit | None:
        """Decide locally whether to stop, or suspend and let the parent restart us.

        ``error`` is None when the actor stopped itself. A pending escalation wins over
        whatever the actor's current message raised meanwhile (typically an
        ``ActorStoppedError`` from asking a child the escalation just stopped).
        Every failure passes here, so this is where a parent that lists ``ChildFailed``
        hears of it, whatever its supervisor then decides.
        """
        if self.escalation is not None:
            error, self.escalation = self.escalation, None
        parent = self.parent
        if error is not None and parent is not None and ChildFailed in parent.accepts:
            parent.mailbox.push_system(ChildFailed(self.ref, error))
        wanted = self.restart == "permanent" if error is None else self.restart != "temporary"
        if not wanted or parent is None or parent.state.ending:
            if error is not None and self.restart == "temporary":
                log.warning("actor %s stopped after a failure: %r", self.path, error)
            return _Exit(error)
        self.state = CellState.SUSPENDED
        parent.supervisor.post(sm.ChildExited(self, error))
        return None

    async def _on_system(self, message: object) -> _Exit | None:
        match message:
            case sm.Stop(reason=reason):
                return _Exit(reason)
            case sm.Fail(error=error):
                if self.state is _RUNNING:
                    return self._fail(error)
            case sm.Suspend():
                if self.state is _RUNNING:
                    self.state = CellState.SUSPENDED
            case sm.Teardown(done=done):
                await self._teardown()
                _resolve(done)
            case sm.Restart(cause=cause, done=done):
                try:
                    await self._teardown()
                    await self._start_instance(cause, first=False)
                except Exception as exc:
                    self.state = CellState.SUSPENDED
                    return self._fail(exc)
                finally:
                    _resolve(done)
            case sm.Control(envelope=envelope):
                if self.state is _RUNNING:
                    return await self._process(envelope)
                self._stash_control(envelope)
            case Terminated() | ChildFailed():
                if self.state is _RUNNING:
                    return await self._process((message, None))
                self.stash.append((message, None))
            case _:
                raise AssertionError(f"unknown system message {message!r}")
        return None

    def _stash_control(self, envelope: Envelope) -> None:
        """Stash a control message ahead of user messages, behind earlier control ones."""
        urgent = itertools.takewhile(lambda e: isinstance(e[0], ControlMessage), self.stash)
        self.stash.insert(sum(1 for _ in urgent), envelope)

    async def _teardown(self) -> None:
        """Stop the children and let the current instance release what it holds.

        Then no task the instance started (``context.tasks``) outlives it.
        """
        await self.supervisor.close()
        await self.stop_children()
        instance, self.instance = self.instance, None
        if instance is not None:
            try:
                await instance.on_stop()
            except Exception:
                log.exception("on_stop of %s raised", self.path)
        await self.tasks.cancel(self.system.stop_timeout, "the actor stopped or restarted")

    async def _terminate(self) -> None:
        self.state = CellState.STOPPING
        await self._teardown()

    def _finalize(self, reason: BaseException | None) -> None:
        """Release everything the cell owns; runs on every exit path, kill included."""
        self.state = CellState.STOPPED
        self.supervisor.abort()
        self.tasks.cancel_now()
        for child in list(self.children.values()):
            child.kill()
        pending = self.mailbox.close()
        pending.extend(self.stash)
        self.stash.clear()
        if self._current_reply is not None:
            pending.append((None, self._current_reply))
        for message, reply in pending:
            if reply is not None and not reply.done():
                reply.set_exception(ActorStoppedError(self.path, "stopped before replying"))
            elif reply is None and message is not None:
                log.debug("dead letter to %s: %r", self.path, message)
        parent = self.parent
        if parent is not None and parent.children.get(self.name) is self:
            del parent.children[self.name]
            parent.supervisor.forget(self)
        self.system._unregister(self)
        for watcher in self.watchers:
            watcher.watching.discard(self)  # a watcher must not keep dead actors alive
            watcher.mailbox.push_system(Terminated(self.ref, reason))
        for watched in self.watching:
            watched.watchers.discard(self)
        self.watchers.clear()
        self.watching.clear()
        if self.started.done() and not self.started.cancelled():
            self.started.exception()  # the spawner has seen it; mark it retrieved
        if not self.terminated.done():
            self.terminated.set_result(reason)


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
